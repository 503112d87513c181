// launch/trainer.h: one rank's training run, as mp_worker runs it: the model
// and data of a resolved TrainConfig (launch/train_config.h), the sharded
// engine, periodic validation, the progress log on rank 0 and the run
// directory (metrics.jsonl, config.textproto, TensorBoard events).
// train() is the loop; its parts: launch/run_model.h (model, data,
// validation, sampling), launch/checkpoint_policy.h (resume, import, saves,
// export), launch/step_agreement.h (the exchange after every step),
// launch/run_log.h (the log) and launch/run_dir.h (the run directory).
//
// Note [Run log]
// Rank 0 prints a header (ranks, model, data, memory plan, the synthetic
// language's entropy floor) and then one line per log_interval steps:
//   step   40/300  loss 3.1234  val 3.2011  lr 2.10e-03  norm 0.812  84.1k tok/s  12.2 ms  1.35 GFLOP/s  ETA 0:03
// On a terminal the line of the latest step is also redrawn in place after
// every step (a live progress line); elsewhere (a file, CI) only the
// log_interval lines are written, so logs stay small and diffable. Under
// mpirun a rank's stdout is a pseudo-terminal even when mpirun's output goes
// to a file, so launch/mprun passes its own answer in MP_STDOUT_TTY;
// MP_PROGRESS=0 or 1 forces it. Validation steps always get a line.
//
// Note [Throughput]
// tokens/s counts every rank's tokens: world x micro_batches x
// micro_batch_size x context per step (samples for the MLP), over the
// step's wall time on rank 0. Model FLOP/s is that rate times
// gpt_train_flops_per_token (models/gpt.h), or 6 x parameters per sample for
// the MLP.
//
// Note [Step agreement]
// After every step the ranks exchange four numbers each (one all-gather):
// whether a stop signal (SIGTERM/SIGUSR1) arrived, rank 0's verdict on the
// checkpoint time interval, the rank's busy time (the step's wall time
// minus the time it was blocked on communication), and whether its
// asynchronous checkpoint write has ended (Note [Asynchronous saves] in
// runtime/checkpoint.h: the save commits at the first step boundary where
// every rank's has). So a signal to any rank
// stops every rank at the same step after a checkpoint, and a rank that
// worked much longer than the others is named in the log (a straggler:
// more than 3x the median of the others and 1 s above it). Skipped steps (non-finite
// gradients) get a line naming the first rank and unit that produced them.
#pragma once

#include "comm/mpi/mpi_world.h"
#include "launch/train_config.h"

namespace mp {

// Trains on every rank of `world`. Collective. Returns the process exit
// code (0). Errors are thrown (launch/rank_main.h turns them into exit codes).
int train(const MpiWorld& world, const TrainSettings& settings);

// The CPU threads each rank's compute gets when compute.threads is 0: the
// cores this process may run on, divided among the node's `local_size`
// ranks when they all share the same cores (no binding), at least 1.
// MP_NUM_THREADS overrides it (launch/mp_node sets it).
int default_threads_per_rank(int local_size);

}  // namespace mp

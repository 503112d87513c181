// bench/suites.h: the suites mp_bench can run. Each is collective over the
// world and throws on failure (ConfigError for bad options); mp_bench's main
// decides the exit code.
#pragma once

#include "bench/bench.h"

namespace mp::bench {

// comm: MpiCommunicator collectives against the raw MPI calls (comm_bench.cc).
void run_comm_suite(const BenchContext& ctx);

// reduce_accuracy: kWire vs kFp32 error against the exact sum (accuracy_bench.cc).
void run_reduce_accuracy_suite(const BenchContext& ctx);

// update: the fused optimizer step vs a STREAM triad (update_bench.cc).
void run_update_suite(const BenchContext& ctx);

// step: one engine step per phase, overlapped vs serialized communication
// (step_bench.cc).
void run_step_suite(const BenchContext& ctx);

}  // namespace mp::bench

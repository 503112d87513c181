// launch/step_agreement.h: what the ranks agree on after every training
// step (Note [Step agreement] in launch/trainer.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/engine.h"

namespace mp {

struct StepAgreement {
  int signal = 0;                        // a stop signal some rank got (the largest number); 0: none
  bool checkpoint_time = false;          // rank 0's checkpoint clock ran out
  std::optional<std::string> straggler;  // find_straggler's line, when a rank was one
  bool save_written = true;              // every rank's asynchronous checkpoint write has ended
};

// One all-gather of four numbers per rank: stop_signal() (core/stop_signals.h),
// `checkpoint_time` (only rank 0's counts), the step's busy time (its wall
// time minus the time blocked on communication) and `save_written`
// (CheckpointWriter::written()). Collective.
StepAgreement agree_on_step(Communicator& comm, bool checkpoint_time, const StepTimings& timings,
                            bool save_written = true);

// A rank that worked much longer than the others in a step (they waited
// for it in the collectives), from each rank's busy seconds: named when it
// exceeds 3x the median of the other ranks and that median by 1 s (less is
// scheduling noise on a shared machine). "rank 2 is a straggler: ...".
std::optional<std::string> find_straggler(const std::vector<double>& busy);

}  // namespace mp

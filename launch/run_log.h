// launch/run_log.h: rank 0's record of a training run: the progress log on
// stdout (Note [Run log] in launch/trainer.h) and the run directory
// (launch/run_dir.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/allocator.h"
#include "kernels/op_profile.h"
#include "launch/metrics.h"
#include "launch/run_dir.h"
#include "launch/run_model.h"
#include "launch/train_config.h"
#include "runtime/engine.h"

namespace mp {

// Whether rank 0 redraws a live progress line (Note [Run log]):
// MP_PROGRESS=1 or 0 decides; else MP_STDOUT_TTY, which launch/mprun sets
// from its own stdout (under mpirun a rank's stdout is a pseudo-terminal even
// when mpirun's is a pipe); else whether stdout is a terminal (a bare
// mp_worker).
bool live_progress();

// "0:42", "1:02:03": whole seconds, rounded.
std::string format_duration(double seconds);

// `v` with an SI prefix and `unit`: si(51234.5, "tok/s") is "51.2 ktok/s".
std::string si(double v, const char* unit);

// What one step gave the log.
struct StepReport {
  int64_t step = 0;  // the run's step, 1-based
  StepResult result;
  std::optional<double> val;             // the validation loss, on validation steps
  std::optional<std::string> sample;     // text sampled from the GPT, on sampling steps
  std::optional<std::string> straggler;  // find_straggler's line (launch/step_agreement.h)
};

class RunLog {
 public:
  // Only rank 0 (`lead`) writes anything. The references must outlive the log.
  RunLog(const TrainSettings& settings, const RunModel& model, const Engine& engine, Allocator allocator,
         int world_size, bool lead);

  // Opens the run directory (RunDir::open) and prints the header: model,
  // data, engine, memory plan, entropy floor, run directory, `start_note`
  // and `checkpoints` (each when not empty). `start`: the step the run goes
  // on from (0: a fresh run).
  // `device`: the line on rank 0's device and data plane (empty: none).
  void begin(int threads, int64_t start, const std::string& start_note, const std::string& checkpoints,
             const std::string& device = {});
  // The step's progress line (Note [Run log]), metrics.jsonl and TensorBoard
  // record, and the lines of a skipped step, a straggler and a sample.
  void step(const StepReport& report);
  // The line of a run that stops at `step` on `signal` after its checkpoint.
  void stopped(int signal, int64_t step);
  // MP_OP_PROFILE's line: rank 0's compute time by op family, largest first.
  void op_profile(const OpProfile& profile);
  // Once, after the run's second step: the ops that step enqueued on rank 0
  // (Note [Op count] in kernels/op_profile.h) and, on a GPU, one line per
  // GEMM plan made so far (its problem, form, algorithm and measured
  // TFLOP/s: Note [cuBLASLt GEMM]).
  void ops(const OpCount& step_ops, const std::vector<std::string>& gemm_plans);
  // The last lines: steps, time, final and validation loss, distance to the
  // entropy floor, and the measured memory.
  void done();

 private:
  StepMetrics metrics(const StepReport& report) const;
  std::string progress_line(const StepReport& report, const StepMetrics& metrics) const;
  std::string skip_line(const StepReport& report) const;

  const TrainSettings& settings_;
  const RunModel& model_;
  const Engine& engine_;
  Allocator allocator_;
  int world_size_;
  bool lead_;
  bool tty_;
  double items_per_step_;  // tokens (GPT) or samples (MLP) per step, every rank's
  RunDir dir_;
  int64_t start_ = 0;
  double elapsed_ = 0;  // seconds of steps so far (validation excluded)
  double last_loss_ = 0;
  std::optional<double> last_val_;
};

}  // namespace mp

// launch/run_dir.h: rank 0's run directory (out_dir): config.textproto (the
// resolved config, which mp_worker runs again), metrics.jsonl
// (launch/metrics.h) and TensorBoard event files (launch/tensorboard.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "launch/metrics.h"
#include "launch/tensorboard.h"
#include "launch/train_config.h"

namespace mp {

class RunDir {
 public:
  RunDir() = default;  // none: every call below does nothing

  // Creates out_dir (none when it is empty) and writes config.textproto.
  // resumed_step > 0: metrics.jsonl keeps its lines up to that step (a
  // resumed run writes the later steps again) and is appended to; else it
  // starts empty. Throws IoError naming what cannot be written.
  static RunDir open(const TrainSettings& settings, int64_t resumed_step);

  bool is_open() const { return metrics_ != nullptr; }
  // The step's metrics.jsonl line and TensorBoard scalars (train/loss,
  // train/lr, train/grad_norm, train/loss_scale, perf/tokens_per_s,
  // perf/step_ms, perf/model_flops_per_s, val/loss on validation steps);
  // `flush`: write TensorBoard's buffer out too.
  void record(const StepMetrics& metrics, bool flush);
  // A sampled text, TensorBoard's "samples" series.
  void add_sample(int64_t step, const std::string& text);
  // Flushes and closes the TensorBoard file.
  void close();

 private:
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace mp

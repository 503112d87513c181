// launch/metrics.h: the run directory and its metrics.jsonl.
//
// metrics.jsonl holds one JSON object per line, one line per record, each
// line written whole and flushed at once, so `tail -f` and a reader polling
// the file never see half a record. Numbers that are not finite (a NaN loss,
// an infinite gradient norm) are written as null: the file stays valid JSON
// for every reader, and null says "no number" where a number is expected.
//
// A step record (StepMetrics) looks like:
//   {"step": 10, "loss": 2.31, "lr": 0.0003, "grad_norm": 1.2,
//    "loss_scale": 65536.0, "skipped": false, "tokens_per_s": 51234.5,
//    "step_ms": 80.0, "model_flops_per_s": 1.2e12,
//    "memory_bytes": {"params": 1024, "grads": 512}, "val_loss": 2.4}
// with "val_loss" present only on steps that ran validation.
//
// Errors: a directory or file that cannot be created or written gives
// IoError naming it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mp {

// Creates `path` and any missing parents and returns `path`. Throws IoError
// naming it when it cannot be created or exists and is not a directory.
std::string make_run_dir(const std::string& path);

struct StepMetrics {
  int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double loss_scale = 1.0;
  bool skipped = false;  // the step was skipped (non-finite gradients)
  double tokens_per_s = 0.0;
  double step_ms = 0.0;
  double model_flops_per_s = 0.0;
  // Named memory totals in bytes, in this order: {"params", ...}.
  std::vector<std::pair<std::string, int64_t>> memory_bytes;
  std::optional<double> val_loss;
};

// The JSON object above, keys in that order; non-finite doubles become null.
nlohmann::ordered_json to_json(const StepMetrics& m);

class MetricsWriter {
 public:
  enum class Mode { kTruncate, kAppend };  // kAppend: continue a resumed run

  // Opens DIR/metrics.jsonl; `dir` must exist (make_run_dir creates it).
  explicit MetricsWriter(const std::string& dir, Mode mode = Mode::kTruncate);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  const std::string& path() const { return path_; }

  // Writes `record`, which must be a JSON object, as one line and flushes.
  // Non-finite numbers anywhere in it are written as null; invalid UTF-8 in
  // strings is replaced by U+FFFD rather than failing the run.
  void write(const nlohmann::json& record);
  void write(const StepMetrics& m);  // to_json(m), in its key order

 private:
  void write_line(const std::string& line);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mp

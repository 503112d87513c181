#include "launch/run_dir.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "mp/config.h"

namespace mp {
namespace {

// Drops the lines of DIR/metrics.jsonl after step `step` (a resumed run
// writes those steps again); lines that do not parse are kept.
void trim_metrics(const std::string& dir, int64_t step) {
  const std::string path = dir + "/metrics.jsonl";
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() > step) {
      continue;
    }
    kept += line + "\n";
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  out << kept;
  if (!out) MP_THROW(IoError, "cannot rewrite ", path);
}

}  // namespace

RunDir RunDir::open(const TrainSettings& settings, int64_t resumed_step) {
  RunDir d;
  const std::string& out = settings.config.out_dir();
  if (out.empty()) return d;
  make_run_dir(out);
  const std::string text = to_text(settings.config);
  const std::string path = out + "/config.textproto";
  std::ofstream f(path);
  f << "# The resolved config of this run (mp_worker " << MP_VERSION << "); mp_worker " << path
    << " runs it again.\n"
    << text;
  f.close();
  if (!f) MP_THROW(IoError, "cannot write ", path);
  if (resumed_step > 0) trim_metrics(out, resumed_step);
  d.metrics_ = std::make_unique<MetricsWriter>(out, resumed_step > 0 ? MetricsWriter::Mode::kAppend
                                                                     : MetricsWriter::Mode::kTruncate);
  d.tensorboard_ = std::make_unique<TensorBoardWriter>(out);
  d.tensorboard_->add_text("config", 0, "```\n" + text + "```");
  return d;
}

void RunDir::record(const StepMetrics& m, bool flush) {
  if (!is_open()) return;
  metrics_->write(m);
  TensorBoardWriter& tb = *tensorboard_;
  tb.add_scalar("train/loss", m.step, m.loss);
  tb.add_scalar("train/lr", m.step, m.lr);
  tb.add_scalar("train/grad_norm", m.step, m.grad_norm);
  tb.add_scalar("train/loss_scale", m.step, m.loss_scale);
  tb.add_scalar("perf/tokens_per_s", m.step, m.tokens_per_s);
  tb.add_scalar("perf/step_ms", m.step, m.step_ms);
  tb.add_scalar("perf/model_flops_per_s", m.step, m.model_flops_per_s);
  if (m.val_loss) tb.add_scalar("val/loss", m.step, *m.val_loss);
  if (flush) tb.flush();
}

void RunDir::add_sample(int64_t step, const std::string& text) {
  if (tensorboard_) tensorboard_->add_text("samples", step, text);
}

void RunDir::close() {
  if (tensorboard_) tensorboard_->close();
}

}  // namespace mp

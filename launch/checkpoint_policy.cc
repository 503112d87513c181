#include "launch/checkpoint_policy.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/stop_signals.h"
#include "launch/run_log.h"
#include "models/gpt_hf.h"

namespace mp {
namespace {

// The unit's flat weights from named parameter values (alignment gaps 0).
std::vector<float> unit_weights(const UnitLayout& ul, const std::map<std::string, std::vector<float>>& named) {
  std::vector<float> full(static_cast<size_t>(ul.numel), 0.0f);
  for (const ParamPlacement& pp : ul.params) {
    const auto it = named.find(pp.name);
    MP_ENFORCE(it != named.end(), "imported weights lack ", pp.name);
    MP_ENFORCE_EQ(static_cast<int64_t>(it->second.size()), pp.numel);
    std::copy(it->second.begin(), it->second.end(), full.begin() + pp.offset);
  }
  return full;
}

}  // namespace

CheckpointPolicy::CheckpointPolicy(Engine& engine, const TrainSettings& settings, bool lead)
    : engine_(engine),
      settings_(settings),
      config_(settings.config.checkpoint()),
      lead_(lead),
      last_save_(std::chrono::steady_clock::now()) {
  save_options_.keep_last = settings.checkpoint_keep_last;
  save_options_.config_text = to_text(settings.config);
  if (settings.checkpoint_saves && config_.async_save()) {
    writer_ = std::make_unique<CheckpointWriter>(engine, settings.checkpoint_dir, save_options_);
  }
}

int64_t CheckpointPolicy::restore() {
  int64_t start = 0;
  if (!config_.resume().empty()) {
    const bool automatic = config_.resume() == "auto";
    const std::string from = resolve_checkpoint(automatic ? settings_.checkpoint_dir : config_.resume(), automatic);
    if (!from.empty()) {
      CheckpointInfo info;
      const proto::CheckpointManifest manifest = load_checkpoint(engine_, from, &info);
      start = info.step;
      note_ = detail::str("resumed from ", from, " at step ", start, " (saved by ", manifest.world_size(),
                          " rank(s), ", std::string(strategy_name(manifest.strategy())), "; read ",
                          si(static_cast<double>(info.bytes), "B"), " on rank 0 in ", info.seconds, " s)");
    } else {
      note_ = "no checkpoint under " + settings_.checkpoint_dir + ": starting fresh";
    }
  }
  if (start == 0 && !config_.init_from_safetensors().empty()) import_weights(config_.init_from_safetensors());
  const int64_t steps = settings_.config.steps();
  if (start > steps) {
    MP_THROW_AGREED(ConfigError, "the checkpoint is at step ", start, ", past steps = ", steps, ": raise steps to go on");
  }
  last_save_ = std::chrono::steady_clock::now();
  return start;
}

void CheckpointPolicy::import_weights(const std::string& path) {
  const std::map<std::string, std::vector<float>> named = import_gpt_hf(path, settings_.gpt);
  const FlatLayout& layout = engine_.layout();
  for (int u = 0; u < layout.num_units(); ++u) engine_.set_weights(u, unit_weights(layout.unit(u), named));
  note_ = "weights from " + path;
}

std::string CheckpointPolicy::describe() const {
  if (!settings_.checkpoint_saves) return "";
  std::string text = "checkpoints: " + settings_.checkpoint_dir + " (";
  if (config_.interval_steps() > 0) text += detail::str("every ", config_.interval_steps(), " steps, ");
  if (config_.interval_minutes() > 0) {
    char minutes[64];
    std::snprintf(minutes, sizeof(minutes), "every %g minutes, ", config_.interval_minutes());
    text += minutes;
  }
  if (config_.save_at_end()) text += "at the end, ";
  if (config_.save_on_signal() || !config_.has_save_on_signal()) text += "on SIGTERM/SIGUSR1, ";
  if (writer_ != nullptr) text += "written in the background, ";
  return text + detail::str("keeping ", settings_.checkpoint_keep_last, ")");
}

bool CheckpointPolicy::saves_on_signal() const {
  return settings_.checkpoint_saves && (config_.save_on_signal() || !config_.has_save_on_signal());
}

bool CheckpointPolicy::time_due() const {
  if (!lead_ || config_.interval_minutes() <= 0) return false;
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_).count() / 60;
  return minutes >= config_.interval_minutes();
}

bool CheckpointPolicy::save_written() const { return writer_ == nullptr || writer_->written(); }

int CheckpointPolicy::after_step(int64_t step, const StepAgreement& agreed) {
  if (!settings_.checkpoint_saves) return 0;  // no checkpoint to save: signals keep their default action
  if (writer_ != nullptr && writer_->pending() && agreed.save_written) commit();
  if (agreed.signal != 0) {
    save(step, stop_signal_name(agreed.signal), true);
  } else if (config_.interval_steps() > 0 && step % config_.interval_steps() == 0) {
    save(step, "interval", false);
  } else if (agreed.checkpoint_time) {
    save(step, "time interval", false);
  }
  return agreed.signal;
}

void CheckpointPolicy::finish() {
  if (settings_.checkpoint_saves && config_.save_at_end()) save(settings_.config.steps(), "end", true);
  commit();
  if (!config_.export_safetensors().empty()) export_weights();
}

void CheckpointPolicy::save(int64_t step, const char* why, bool complete) {
  const char* clear = live_progress() ? "\r\033[K" : "";
  if (writer_ == nullptr) {
    const CheckpointInfo info = save_checkpoint(engine_, settings_.checkpoint_dir, save_options_);
    last_save_ = std::chrono::steady_clock::now();
    if (!lead_) return;
    std::printf("%scheckpoint at step %lld (%s): %s, %s in %.2f s\n", clear, static_cast<long long>(step), why,
                info.path.c_str(), si(static_cast<double>(info.bytes), "B").c_str(), info.seconds);
    std::fflush(stdout);
    return;
  }
  // The previous save, if its write is still in flight, is committed first
  // (save_async would do it too, but silently): its line is in the log
  // whether it finished before this step or not.
  if (writer_->pending()) commit();
  const CheckpointInfo info = writer_->save_async();
  last_save_ = std::chrono::steady_clock::now();
  if (lead_ && writer_->pending()) {
    std::printf("%scheckpoint at step %lld (%s): snapshot of %s on rank 0 in %.2f s, writing in the background\n",
                clear, static_cast<long long>(step), why,
                si(static_cast<double>(writer_->snapshot_bytes()), "B").c_str(), info.seconds);
    std::fflush(stdout);
  }
  if (complete) commit();
}

void CheckpointPolicy::commit() {
  if (writer_ == nullptr) return;
  const std::optional<CheckpointInfo> info = writer_->wait();
  if (!info || !lead_) return;
  std::printf("%scheckpoint at step %lld committed: %s, %s, written in the background in %.2f s on rank 0\n",
              live_progress() ? "\r\033[K" : "", static_cast<long long>(info->step), info->path.c_str(),
              si(static_cast<double>(info->bytes), "B").c_str(), info->write_seconds);
  std::fflush(stdout);
}

// Every rank gathers every unit (collective); rank 0 writes the export.
void CheckpointPolicy::export_weights() {
  const FlatLayout& L = engine_.layout();
  std::map<std::string, std::vector<float>> named;
  for (int u = 0; u < L.num_units(); ++u) {
    const std::vector<float> w = engine_.gather_master(u);
    for (const ParamPlacement& pp : L.unit(u).params) {
      named[pp.name].assign(w.begin() + pp.offset, w.begin() + pp.offset + pp.numel);
    }
  }
  if (!lead_) return;
  const DType dtype = config_.export_dtype() == proto::BF16 ? DType::kBF16 : DType::kF32;
  export_gpt_hf(config_.export_safetensors(), settings_.gpt, [&](const std::string& name) { return named.at(name); },
                dtype);
  std::printf("exported the weights (%s) to %s: model.safetensors + config.json, loads with "
              "transformers.GPT2LMHeadModel.from_pretrained\n",
              std::string(dtype_name(dtype)).c_str(), config_.export_safetensors().c_str());
}

}  // namespace mp

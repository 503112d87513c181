#include "launch/run_log.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/stop_signals.h"
#include "kernels/cpu/gemm.h"
#include "mp/config.h"
#include "runtime/muon_plan.h"
#if MP_WITH_CUDA
#include "kernels/cuda/attention_cuda.h"
#endif

namespace mp {

bool live_progress() {
  for (const char* var : {"MP_PROGRESS", "MP_STDOUT_TTY"}) {
    if (const char* env = std::getenv(var); env != nullptr && *env != '\0') return std::string(env) != "0";
  }
  return isatty(fileno(stdout)) != 0;
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", s / 3600, (s / 60) % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", s / 60, s % 60);
  }
  return buf;
}

std::string si(double v, const char* unit) {
  const char* prefixes[] = {"", "k", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 5) {
    v /= 1000;
    ++i;
  }
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*f %s%s", v < 10 ? 2 : (v < 100 ? 1 : 0), v, prefixes[i], unit);
  return buf;
}

RunLog::RunLog(const TrainSettings& settings, const RunModel& model, const Engine& engine, Allocator allocator,
               int world_size, bool lead)
    : settings_(settings),
      model_(model),
      engine_(engine),
      allocator_(std::move(allocator)),
      world_size_(world_size),
      lead_(lead),
      tty_(lead && live_progress()),
      items_per_step_(model.items_per_micro_batch * engine.options().micro_batches * world_size) {}

void RunLog::begin(int threads, int64_t start, const std::string& start_note, const std::string& checkpoints,
                   const std::string& device) {
  start_ = start;
  if (!lead_) return;
  dir_ = RunDir::open(settings_, start);
  const EngineOptions& o = engine_.options();
  std::printf("model: %s\ndata: %s\n", model_.description.c_str(), model_.data_description.c_str());
  std::printf("engine: %s, %s; %d rank(s) x %d thread(s), %d micro-batch(es) per rank per step, %s per step\n",
              std::string(strategy_name(o.strategy)).c_str(), o.precision.describe().c_str(), world_size_, threads,
              o.micro_batches, si(items_per_step_, model_.gpt != nullptr ? "tokens" : "samples").c_str());
  if (!device.empty()) std::printf("device (rank 0): %s\n", device.c_str());
#if MP_WITH_CUDA
  if (allocator_.device().is_cuda()) std::printf("cudnn (rank 0): %s\n", attention_cudnn_library().c_str());
#endif
  if (const MuonSettings* muon = engine_.optimizer().muon(); muon != nullptr) {  // Note [Muon owners]
    std::printf("%s", describe_muon_owners(muon_matrices(engine_.layout(), muon->hyper, o.shard_size), o.shard_size)
                          .c_str());
  }
  if (allocator_.device().is_cpu()) {
    std::printf("cpu GEMMs: %s\n", gemm_describe());  // Note [bf16 GEMMs on the CPU]
    const bool bf16_recipe = o.precision.param_dtype == DType::kBF16 || settings_.gpt_matmul_dtype() == DType::kBF16;
    if (bf16_recipe && !gemm_native_bf16()) {
      std::printf("note: a bf16 recipe on a CPU whose GEMMs widen bf16 to fp32: it runs at about fp32's speed, "
                  "and precision fp32 is as fast with fp32 weights and activations (docs/precision.md)\n");
    }
  }
  MemoryPlan plan = engine_.plan();
  plan.bytes[static_cast<size_t>(MemCategory::kActivations)] = static_cast<size_t>(model_.activation_bytes);
  if (settings_.checkpoint_saves && settings_.config.checkpoint().async_save()) {
    plan.checkpoint_snapshot_bytes = plan_checkpoint_snapshot(model_.model->spec(), o);
  }
  std::printf("memory per rank (planned): %s", plan.to_string().c_str());
  if (model_.floor) {
    const int64_t vocab = settings_.gpt.vocab;
    std::printf("the synthetic language's entropy floor: %.4f nats (a model that learned nothing: ln %lld = %.4f)\n",
                *model_.floor, static_cast<long long>(vocab), std::log(static_cast<double>(vocab)));
  }
  if (dir_.is_open()) std::printf("run directory: %s\n", settings_.config.out_dir().c_str());
  if (!start_note.empty()) std::printf("%s\n", start_note.c_str());
  if (!checkpoints.empty()) std::printf("%s\n", checkpoints.c_str());
  std::fflush(stdout);
}

void RunLog::op_profile(const OpProfile& profile) {
  if (!lead_) return;
  std::vector<int> order(kNumOpFamilies);
  for (int f = 0; f < kNumOpFamilies; ++f) order[static_cast<size_t>(f)] = f;
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return profile.seconds[static_cast<size_t>(a)] > profile.seconds[static_cast<size_t>(b)];
  });
  const double total = std::max(profile.total_s(), 1e-12);
  std::printf("compute by op family (MP_OP_PROFILE, rank 0, %.1f ms in all):", 1e3 * profile.total_s());
  for (int f : order) {
    const auto k = static_cast<size_t>(f);
    if (profile.calls[k] == 0) continue;
    std::printf(" %s %.1f%% (%.1f ms, %lld)", std::string(op_family_name(static_cast<OpFamily>(f))).c_str(),
                100.0 * profile.seconds[k] / total, 1e3 * profile.seconds[k], static_cast<long long>(profile.calls[k]));
  }
  std::printf("\n");
  std::fflush(stdout);
}

void RunLog::ops(const OpCount& step_ops, const std::vector<std::string>& gemm_plans) {
  if (!lead_) return;
  std::printf("ops per step (rank 0): %lld (model %lld, engine %lld)\n", static_cast<long long>(step_ops.total()),
              static_cast<long long>(step_ops.model), static_cast<long long>(step_ops.engine));
  for (const std::string& plan : gemm_plans) std::printf("  gemm plan: %s\n", plan.c_str());
  std::fflush(stdout);
}

StepMetrics RunLog::metrics(const StepReport& report) const {
  const StepResult& r = report.result;
  const double step_s = std::max(r.timings.total_s, 1e-9);
  StepMetrics sm;
  sm.step = r.step;
  sm.loss = r.loss;
  sm.lr = r.lr;
  sm.grad_norm = r.grad_norm;
  sm.loss_scale = r.loss_scale;
  sm.skipped = r.skipped;
  sm.tokens_per_s = items_per_step_ / step_s;
  sm.step_ms = 1e3 * step_s;
  sm.model_flops_per_s = sm.tokens_per_s * model_.flops_per_item;
  const MemStats mem = allocator_.stats();
  for (int cat = 0; cat < kNumMemCategories; ++cat) {
    const size_t bytes = mem.current_bytes[static_cast<size_t>(cat)];
    if (bytes > 0) {
      sm.memory_bytes.emplace_back(std::string(mem_category_name(static_cast<MemCategory>(cat))),
                                   static_cast<int64_t>(bytes));
    }
  }
  sm.val_loss = report.val;
  return sm;
}

std::string RunLog::progress_line(const StepReport& report, const StepMetrics& sm) const {
  const StepResult& r = report.result;
  const int64_t steps = settings_.config.steps(), i = report.step;
  char line[320];
  int n = std::snprintf(line, sizeof(line), "step %*lld/%lld  loss %.4f", static_cast<int>(std::to_string(steps).size()),
                        static_cast<long long>(i), static_cast<long long>(steps), r.loss);
  if (report.val) n += std::snprintf(line + n, sizeof(line) - static_cast<size_t>(n), "  val %.4f", *report.val);
  std::snprintf(line + n, sizeof(line) - static_cast<size_t>(n), "  lr %.2e  norm %.3f%s  %s  %.1f ms  %s  ETA %s",
                r.lr, r.grad_norm, r.skipped ? "  SKIPPED" : "",
                si(sm.tokens_per_s, model_.gpt != nullptr ? "tok/s" : "samples/s").c_str(), sm.step_ms,
                si(sm.model_flops_per_s, "FLOP/s").c_str(),
                format_duration(elapsed_ / static_cast<double>(i - start_) * static_cast<double>(steps - i)).c_str());
  return line;
}

std::string RunLog::skip_line(const StepReport& report) const {
  const StepResult& r = report.result;
  const EngineOptions& o = engine_.options();
  const std::string where = r.non_finite_rank >= 0
                                ? detail::str("first from rank ", r.non_finite_rank, ", unit ",
                                              engine_.layout().unit(r.non_finite_unit).name)
                            : o.locate_non_finite ? "in the reduction"
                                                  : "set engine.locate_non_finite=true to name the rank and unit";
  return detail::str("step ", report.step, " skipped: non-finite gradients, ", where, "; ", r.consecutive_skips,
                     " in a row (the run stops at ", o.max_consecutive_skips, ")");
}

void RunLog::step(const StepReport& report) {
  const int64_t i = report.step, steps = settings_.config.steps();
  elapsed_ += report.result.timings.total_s;
  last_loss_ = report.result.loss;
  if (report.val) last_val_ = report.val;
  if (!lead_) return;
  const bool logged = i % std::max<int64_t>(1, settings_.config.log_interval()) == 0 || i == steps;
  const StepMetrics sm = metrics(report);
  dir_.record(sm, logged);
  const std::string line = progress_line(report, sm);
  if (logged || i == 1 || report.val) {
    std::printf(tty_ ? "\r\033[K%s\n" : "%s\n", line.c_str());
  } else if (tty_) {
    std::printf("\r\033[K%s", line.c_str());
  }
  if (report.result.skipped) std::printf("%s\n", skip_line(report).c_str());
  if (report.straggler) std::printf("step %lld: %s\n", static_cast<long long>(i), report.straggler->c_str());
  if (report.sample) {
    std::printf("sample at step %lld: %s\n", static_cast<long long>(i), report.sample->c_str());
    dir_.add_sample(i, *report.sample);
  }
  std::fflush(stdout);
}

void RunLog::stopped(int signal, int64_t step) {
  if (!lead_) return;
  std::printf("got %s at step %lld of %lld: checkpoint saved, stopping (go on with --resume %s)\n",
              stop_signal_name(signal), static_cast<long long>(step), static_cast<long long>(settings_.config.steps()),
              settings_.checkpoint_dir.c_str());
  dir_.close();
}

void RunLog::done() {
  if (!lead_) return;
  const int64_t steps = settings_.config.steps();
  if (steps == start_) {  // resumed at its last step (a requeued job that had finished): no loss to report
    std::printf("done: already at step %lld of %lld, nothing to train", static_cast<long long>(start_),
                static_cast<long long>(steps));
  } else {
    std::printf("done: %lld steps in %s, final loss %.4f", static_cast<long long>(steps - start_),
                format_duration(elapsed_).c_str(), last_loss_);
    if (last_val_) std::printf(", validation loss %.4f", *last_val_);
    if (model_.floor) std::printf(", %.4f above the entropy floor %.4f", last_loss_ - *model_.floor, *model_.floor);
  }
  std::printf("\nmemory per rank (measured): %s\n", allocator_.stats().to_string().c_str());
  dir_.close();
}

}  // namespace mp

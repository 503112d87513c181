#include "launch/trainer.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/comm_config.h"
#include "comm/mpi/mpi_communicator.h"
#include "launch/rank_info.h"
#include "mp/config.h"
#include "models/gpt.h"
#include "models/gpt_hf.h"
#include "models/gpt_sample.h"
#include "models/mlp.h"
#include "models/token_data.h"
#include "runtime/checkpoint.h"
#include "runtime/engine.h"
#include "core/error.h"
#include "launch/metrics.h"
#include "core/parallel.h"
#include "core/stop_signals.h"
#include "launch/tensorboard.h"
#include "formats/token_file.h"

namespace mp {

int default_threads_per_rank(int local_size) {
  if (const char* env = std::getenv("MP_NUM_THREADS"); env != nullptr && *env != '\0') {
    return default_cpu_threads();  // parses and checks MP_NUM_THREADS
  }
  cpu_set_t set;
  int allowed = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (sched_getaffinity(0, sizeof(set), &set) == 0) allowed = std::max(1, CPU_COUNT(&set));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Bound to fewer cores than the node has: the launcher split them already.
  if (allowed < cores) return allowed;
  return std::max(1, allowed / std::max(1, local_size));
}

namespace {

// Micro-batch indices of the held-out data: the synthetic language and the
// MLP's data are pure functions of the index, and training never reaches
// this one (it would take 2^40 micro-batches).
constexpr int64_t kHeldOutFirst = int64_t{1} << 40;

// Note [Run log]'s live line: MP_PROGRESS=1 or 0 decides; else
// MP_STDOUT_TTY, which launch/mprun sets from its own stdout (under mpirun
// a rank's stdout is a pseudo-terminal even when mpirun's is a pipe); else
// whether stdout is a terminal (a bare mp_worker).
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

// The model, its data and what the log says about them.
struct RunModel {
  std::unique_ptr<Model> model;
  Gpt* gpt = nullptr;                                   // when the model is the GPT
  std::shared_ptr<const TokenBatchSource> train, val;  // GPT sources; val null: held-out indices of train
  int64_t val_first = kHeldOutFirst;                    // first validation micro-batch index
  std::optional<double> floor;                          // the synthetic language's entropy floor
  double items_per_micro_batch = 0;                     // tokens (GPT) or samples (MLP)
  double flops_per_item = 0;
  std::string description;
  std::string data_description;
};

RunModel make_model(const TrainSettings& s, int threads, Allocator allocator) {
  RunModel m;
  const proto::TrainConfig& c = s.config;
  if (s.model == ModelKind::kMlp) {
    MlpConfig mc = s.mlp;
    mc.threads = mc.threads > 0 ? mc.threads : threads;
    m.model = std::make_unique<Mlp>(mc, allocator);
    m.items_per_micro_batch = static_cast<double>(mc.micro_batch_size);
    m.flops_per_item = 6.0 * static_cast<double>(m.model->spec().numel());
    m.description = "MLP of " + std::to_string(m.model->spec().numel()) + " parameters";
    m.data_description = "synthetic classification data (models/mlp.h), held out: micro-batches from 2^40";
    return m;
  }
  GptConfig g = s.gpt;
  g.threads = g.threads > 0 ? g.threads : threads;
  g.matmul_dtype = s.gpt_matmul_dtype();
  g.fp32_ops.assign(c.compute().fp32_ops().begin(), c.compute().fp32_ops().end());
  const std::string& train_path = c.data().train_path();
  if (train_path.empty()) {
    auto data = std::make_shared<const GptData>(g);
    m.floor = data->entropy_floor();
    m.train = data;
  } else {
    auto file = std::make_shared<const TokenFile>(TokenFile::read(train_path, g.vocab));
    int64_t train_end = file->size();
    const uint64_t seed = c.data().seed();
    if (!c.data().val_path().empty()) {
      auto val = std::make_shared<const TokenFile>(TokenFile::read(c.data().val_path(), g.vocab));
      m.val = std::make_shared<TokenWindows>(val, 0, val->size(), g.micro_batch_size, g.context, seed, false);
    } else if (c.data().val_fraction() > 0) {
      train_end = file->size() - static_cast<int64_t>(std::floor(c.data().val_fraction() * file->size()));
      m.val = std::make_shared<TokenWindows>(file, train_end, file->size(), g.micro_batch_size, g.context, seed,
                                             false);
    }
    m.train = std::make_shared<TokenWindows>(file, 0, train_end, g.micro_batch_size, g.context, seed, true);
    if (m.val) m.val_first = 0;
  }
  auto gpt = std::make_unique<Gpt>(g, allocator, m.train);
  m.gpt = gpt.get();
  m.model = std::move(gpt);
  m.items_per_micro_batch = static_cast<double>(g.micro_batch_size * g.context);
  m.flops_per_item = gpt_train_flops_per_token(g);
  m.description = gpt_describe(g);
  m.data_description = "train: " + m.train->describe() + "\n  validation: " +
                       (m.val ? m.val->describe() : "held-out sequences of the same source (index 2^40 on)");
  return m;
}

// Text from the GPT (models/gpt_sample.h): one forward per token through
// the engine (collective).
std::string sample_text(Engine& engine, RunModel& m, int count, uint64_t seed, int64_t step) {
  const std::vector<int32_t> tokens =
      gpt_sample(*m.gpt, [&] { engine.evaluate(*m.model, 0, 1); }, count, seed, step);
  return gpt_tokens_text(tokens, m.gpt->config().vocab);
}

double validate(Engine& engine, RunModel& m, int batches) {
  if (m.gpt != nullptr && m.val) m.gpt->set_source(m.val);
  const double loss = engine.evaluate(*m.model, m.val_first, batches);
  if (m.gpt != nullptr && m.val) m.gpt->set_source(m.train);
  return loss;
}

// Rank 0's run directory: config.textproto, metrics.jsonl, TensorBoard.
struct RunDir {
  std::unique_ptr<MetricsWriter> metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;
};

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

RunDir open_run_dir(const TrainSettings& s, int64_t resumed_step) {
  RunDir d;
  const std::string& out = s.config.out_dir();
  if (out.empty()) return d;
  make_run_dir(out);
  const std::string text = to_text(s.config);
  const std::string path = out + "/config.textproto";
  std::ofstream f(path);
  f << "# The resolved config of this run (mp_worker " << MP_VERSION << "); mp_worker " << path
    << " runs it again.\n"
    << text;
  f.close();
  if (!f) MP_THROW(IoError, "cannot write ", path);
  if (resumed_step > 0) trim_metrics(out, resumed_step);
  d.metrics = std::make_unique<MetricsWriter>(out, resumed_step > 0 ? MetricsWriter::Mode::kAppend
                                                                    : MetricsWriter::Mode::kTruncate);
  d.tensorboard = std::make_unique<TensorBoardWriter>(out);
  d.tensorboard->add_text("config", 0, "```\n" + text + "```");
  return d;
}

// A rank that worked much longer than the others in a step (they waited
// for it in the collectives): busy = step time minus time blocked on
// communication, per rank. Named when it exceeds 3x the median of the
// other ranks and that median by 1 s (less is scheduling noise on a
// shared machine).
std::optional<std::string> find_straggler(const std::vector<double>& busy) {
  if (busy.size() < 2) return std::nullopt;
  const auto slowest = std::max_element(busy.begin(), busy.end());
  std::vector<double> others = busy;  // the median of the other ranks
  others.erase(others.begin() + (slowest - busy.begin()));
  std::sort(others.begin(), others.end());
  const double median = others[(others.size() - 1) / 2];
  if (*slowest < 3 * median || *slowest - median < 1.0) return std::nullopt;
  char text[160];
  std::snprintf(text, sizeof(text), "rank %d is a straggler: %.2f s of work in this step against a median of %.2f s on the others",
                static_cast<int>(slowest - busy.begin()), *slowest, median);
  return std::string(text) + " (the others waited for it)";
}

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

// Every rank gathers every unit (collective); rank 0 writes the export.
void export_weights(Engine& engine, const TrainSettings& s, bool lead) {
  const FlatLayout& L = engine.layout();
  std::map<std::string, std::vector<float>> named;
  for (int u = 0; u < L.num_units(); ++u) {
    const std::vector<float> w = engine.gather_master(u);
    for (const ParamPlacement& pp : L.unit(u).params) {
      named[pp.name].assign(w.begin() + pp.offset, w.begin() + pp.offset + pp.numel);
    }
  }
  if (!lead) return;
  const proto::CheckpointConfig& k = s.config.checkpoint();
  const DType dtype = k.export_dtype() == proto::BF16 ? DType::kBF16 : DType::kF32;
  export_gpt_hf(k.export_safetensors(), s.gpt, [&](const std::string& name) { return named.at(name); }, dtype);
  std::printf("exported the weights (%s) to %s: model.safetensors + config.json, loads with "
              "transformers.GPT2LMHeadModel.from_pretrained\n",
              std::string(dtype_name(dtype)).c_str(), k.export_safetensors().c_str());
}

}  // namespace

int train(const MpiWorld& world, const TrainSettings& s) {
  const proto::TrainConfig& c = s.config;
  const bool lead = world.rank() == 0;
  const int threads = c.compute().threads() > 0 ? c.compute().threads() : default_threads_per_rank(world.local_size());
  Allocator allocator;
  auto comm = MpiCommunicator::create_world("world", comm_options_from_config(c.engine().comm()));
  RunModel m = make_model(s, threads, allocator);
  Engine engine(m.model->spec(), c.engine(), *comm, allocator);

  // Where the run starts: a checkpoint, imported weights, or the init.
  const proto::CheckpointConfig& kc = c.checkpoint();
  int64_t start = 0;
  std::string start_note;
  if (!kc.resume().empty()) {
    const bool automatic = kc.resume() == "auto";
    const std::string from = resolve_checkpoint(automatic ? s.checkpoint_dir : kc.resume(), automatic);
    if (!from.empty()) {
      CheckpointInfo info;
      const proto::CheckpointManifest manifest = load_checkpoint(engine, from, &info);
      start = info.step;
      start_note = detail::str("resumed from ", from, " at step ", start, " (saved by ", manifest.world_size(),
                               " rank(s), ", std::string(strategy_name(manifest.strategy())), "; read ",
                               si(static_cast<double>(info.bytes), "B"), " on rank 0 in ", info.seconds, " s)");
    } else {
      start_note = "no checkpoint under " + s.checkpoint_dir + ": starting fresh";
    }
  }
  if (start == 0 && !kc.init_from_safetensors().empty()) {
    const std::map<std::string, std::vector<float>> named = import_gpt_hf(kc.init_from_safetensors(), s.gpt);
    for (int u = 0; u < engine.layout().num_units(); ++u) engine.set_weights(u, unit_weights(engine.layout().unit(u), named));
    start_note = "weights from " + kc.init_from_safetensors();
  }
  if (start > c.steps()) {
    MP_THROW_AGREED(ConfigError, "the checkpoint is at step ", start, ", past steps = ", c.steps(), ": raise steps to go on");
  }
  RunDir dir = lead ? open_run_dir(s, start) : RunDir{};

  const int W = world.size();
  const int k = engine.options().micro_batches;
  const double items_per_step = m.items_per_micro_batch * k * W;
  const bool tty = lead && live_progress();
  if (lead) {
    std::printf("model: %s\ndata: %s\n", m.description.c_str(), m.data_description.c_str());
    std::printf("engine: %s, %s; %d rank(s) x %d thread(s), %d micro-batch(es) per rank per step, %s per step\n",
                std::string(strategy_name(engine.options().strategy)).c_str(), engine.options().precision.describe().c_str(), W, threads,
                k, si(items_per_step, s.model == ModelKind::kGpt ? "tokens" : "samples").c_str());
    std::printf("memory per rank (planned): %s", engine.plan().to_string().c_str());
    if (m.floor) {
      std::printf("the synthetic language's entropy floor: %.4f nats (a model that learned nothing: ln %lld = %.4f)\n",
                  *m.floor, static_cast<long long>(s.gpt.vocab), std::log(static_cast<double>(s.gpt.vocab)));
    }
    if (dir.metrics) std::printf("run directory: %s\n", c.out_dir().c_str());
    if (!start_note.empty()) std::printf("%s\n", start_note.c_str());
    if (s.checkpoint_saves) {
      std::printf("checkpoints: %s (", s.checkpoint_dir.c_str());
      if (kc.interval_steps() > 0) std::printf("every %lld steps, ", static_cast<long long>(kc.interval_steps()));
      if (kc.interval_minutes() > 0) std::printf("every %g minutes, ", kc.interval_minutes());
      if (kc.save_at_end()) std::printf("at the end, ");
      if (kc.save_on_signal() || !kc.has_save_on_signal()) std::printf("on SIGTERM/SIGUSR1, ");
      std::printf("keeping %d)\n", s.checkpoint_keep_last);
    }
    std::fflush(stdout);
  }
  const bool on_signal = s.checkpoint_saves && (kc.save_on_signal() || !kc.has_save_on_signal());
  // Note [Signals and oneDNN]: recorded by the watcher thread, acted on at
  // the next step boundary (every rank agrees there).
  std::optional<StopSignalScope> signals;
  if (on_signal) signals.emplace();
  CheckpointSaveOptions save_options;
  save_options.keep_last = s.checkpoint_keep_last;
  save_options.config_text = to_text(c);
  auto last_save = std::chrono::steady_clock::now();
  auto save = [&](int64_t step, const char* why) {
    const CheckpointInfo info = save_checkpoint(engine, s.checkpoint_dir, save_options);
    last_save = std::chrono::steady_clock::now();
    if (lead) {
      std::printf("%scheckpoint at step %lld (%s): %s, %s in %.2f s\n", live_progress() ? "\r\033[K" : "",
                  static_cast<long long>(step), why, info.path.c_str(), si(static_cast<double>(info.bytes), "B").c_str(),
                  info.seconds);
      std::fflush(stdout);
    }
  };
  int agreed_signal = 0;

  const int64_t steps = c.steps();
  const int64_t log_every = std::max<int64_t>(1, c.log_interval());
  double elapsed = 0;  // seconds of steps so far (validation excluded)
  double last_loss = 0;
  std::optional<double> last_val;
  int64_t last_step = start;
  for (int64_t i = start + 1; i <= steps && agreed_signal == 0; ++i) {
    last_step = i;
    const StepResult r = engine.step(*m.model);
    elapsed += r.timings.total_s;
    last_loss = r.loss;
    std::optional<double> val;
    if (c.val_interval() > 0 && (i % c.val_interval() == 0 || i == steps)) {
      val = validate(engine, m, std::max(1, c.val_batches()));
      last_val = val;
    }
    std::optional<std::string> sample;
    if (m.gpt != nullptr && c.sample_interval() > 0 && (i % c.sample_interval() == 0 || i == steps)) {
      sample = sample_text(engine, m, c.sample_tokens(), c.engine().seed(), i);
    }
    // One small exchange per step (Note [Step agreement] in trainer.h): a
    // stop signal on any rank, rank 0's checkpoint clock, and every rank's
    // busy time, which names a straggler.
    const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save).count() / 60;
    const double mine[3] = {static_cast<double>(stop_signal()),
                            lead && kc.interval_minutes() > 0 && minutes >= kc.interval_minutes() ? 1.0 : 0.0,
                            r.timings.total_s - r.timings.exposed_comm_s};
    const std::vector<double> all = comm->all_gather_double(mine);
    std::vector<double> busy(static_cast<size_t>(W));
    for (size_t j = 0; j < busy.size(); ++j) {
      agreed_signal = std::max(agreed_signal, static_cast<int>(all[3 * j]));
      busy[j] = all[3 * j + 2];
    }
    const std::optional<std::string> straggler = find_straggler(busy);
    if (s.checkpoint_saves) {
      if (agreed_signal != 0) {
        save(i, stop_signal_name(agreed_signal));
      } else if (kc.interval_steps() > 0 && i % kc.interval_steps() == 0) {
        save(i, "interval");
      } else if (all[1] != 0) {
        save(i, "time interval");
      }
    } else {
      agreed_signal = 0;  // no checkpoint to save: signals keep their default action
    }
    if (!lead) continue;
    const double step_s = std::max(r.timings.total_s, 1e-9);
    StepMetrics sm;
    sm.step = r.step;
    sm.loss = r.loss;
    sm.lr = r.lr;
    sm.grad_norm = r.grad_norm;
    sm.loss_scale = r.loss_scale;
    sm.skipped = r.skipped;
    sm.tokens_per_s = items_per_step / step_s;
    sm.step_ms = 1e3 * step_s;
    sm.model_flops_per_s = sm.tokens_per_s * m.flops_per_item;
    const MemStats mem = allocator.stats();
    for (int cat = 0; cat < kNumMemCategories; ++cat) {
      const size_t bytes = mem.current_bytes[static_cast<size_t>(cat)];
      if (bytes > 0) {
        sm.memory_bytes.emplace_back(std::string(mem_category_name(static_cast<MemCategory>(cat))),
                                     static_cast<int64_t>(bytes));
      }
    }
    sm.val_loss = val;
    if (dir.metrics) {
      dir.metrics->write(sm);
      TensorBoardWriter& tb = *dir.tensorboard;
      tb.add_scalar("train/loss", r.step, r.loss);
      tb.add_scalar("train/lr", r.step, r.lr);
      tb.add_scalar("train/grad_norm", r.step, r.grad_norm);
      tb.add_scalar("train/loss_scale", r.step, r.loss_scale);
      tb.add_scalar("perf/tokens_per_s", r.step, sm.tokens_per_s);
      tb.add_scalar("perf/step_ms", r.step, sm.step_ms);
      tb.add_scalar("perf/model_flops_per_s", r.step, sm.model_flops_per_s);
      if (val) tb.add_scalar("val/loss", r.step, *val);
      if (i % log_every == 0 || i == steps) tb.flush();
    }
    char line[320];
    int n = std::snprintf(line, sizeof(line), "step %*lld/%lld  loss %.4f", static_cast<int>(std::to_string(steps).size()),
                          static_cast<long long>(i), static_cast<long long>(steps), r.loss);
    if (val) n += std::snprintf(line + n, sizeof(line) - static_cast<size_t>(n), "  val %.4f", *val);
    n += std::snprintf(line + n, sizeof(line) - static_cast<size_t>(n), "  lr %.2e  norm %.3f%s  %s  %.1f ms  %s  ETA %s",
                       r.lr, r.grad_norm, r.skipped ? "  SKIPPED" : "",
                       si(sm.tokens_per_s, s.model == ModelKind::kGpt ? "tok/s" : "samples/s").c_str(), sm.step_ms,
                       si(sm.model_flops_per_s, "FLOP/s").c_str(),
                       format_duration(elapsed / static_cast<double>(i - start) * static_cast<double>(steps - i)).c_str());
    if (i % log_every == 0 || i == steps || i == 1 || val) {
      std::printf(tty ? "\r\033[K%s\n" : "%s\n", line);
    } else if (tty) {
      std::printf("\r\033[K%s", line);
    }
    if (r.skipped) {
      std::printf("step %lld skipped: non-finite gradients, %s; %lld in a row (the run stops at %d)\n",
                  static_cast<long long>(i),
                  r.non_finite_rank >= 0
                      ? detail::str("first from rank ", r.non_finite_rank, ", unit ",
                                    engine.layout().unit(r.non_finite_unit).name)
                            .c_str()
                      : engine.options().locate_non_finite ? "in the reduction"
                                                           : "set engine.locate_non_finite=true to name the rank and unit",
                  static_cast<long long>(r.consecutive_skips), engine.options().max_consecutive_skips);
    }
    if (straggler) std::printf("step %lld: %s\n", static_cast<long long>(i), straggler->c_str());
    if (sample) {
      std::printf("sample at step %lld: %s\n", static_cast<long long>(i), sample->c_str());
      if (dir.tensorboard) dir.tensorboard->add_text("samples", i, *sample);
    }
    std::fflush(stdout);
  }
  if (agreed_signal != 0) {
    if (lead) {
      std::printf("got %s at step %lld of %lld: checkpoint saved, stopping (go on with --resume %s)\n",
                  stop_signal_name(agreed_signal), static_cast<long long>(last_step), static_cast<long long>(steps),
                  s.checkpoint_dir.c_str());
      if (dir.tensorboard) dir.tensorboard->close();
    }
    return 0;
  }
  if (s.checkpoint_saves && kc.save_at_end()) save(steps, "end");
  if (!kc.export_safetensors().empty()) export_weights(engine, s, lead);
  if (lead) {
    std::printf("done: %lld steps in %s, final loss %.4f", static_cast<long long>(steps - start),
                format_duration(elapsed).c_str(), last_loss);
    if (last_val) std::printf(", validation loss %.4f", *last_val);
    if (m.floor) std::printf(", %.4f above the entropy floor %.4f", last_loss - *m.floor, *m.floor);
    std::printf("\nmemory per rank (measured): %s\n", allocator.stats().to_string().c_str());
    if (dir.tensorboard) dir.tensorboard->close();
  }
  return 0;
}

}  // namespace mp

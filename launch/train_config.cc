#include "launch/train_config.h"

#include <google/protobuf/text_format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "formats/text_overrides.h"
#include "formats/text_proto.h"
#include "models/model_limits.h"

namespace mp {
namespace {

namespace pb = google::protobuf;

// configs/default.textproto as a raw string literal, written by
// launch/CMakeLists.txt at configure time (re-run whenever the file changes).
constexpr char kDefaultConfigText[] =
#include "launch/default_train_config.inc"
    ;
constexpr const char* kDefaultConfigName = "configs/default.textproto (embedded)";

// ---- resolving ----------------------------------------------------------------------

void check_positive(const char* field, int64_t value) {
  if (value <= 0) MP_THROW(ConfigError, field, " = ", value, ": must be positive");
}

void check_not_negative(const char* field, int64_t value) {
  if (value < 0) MP_THROW(ConfigError, field, " = ", value, ": must not be negative");
}

// model.gpt: zero fields take the embedded default's (proto/mp.proto); the
// size rules are models/gpt.h's.
GptConfig resolve_gpt(proto::GptModelConfig& g) {
  const proto::TrainConfig base = default_train_config();
  const proto::GptModelConfig& d = base.model().gpt();
  if (g.vocab() == 0) g.set_vocab(d.vocab());
  if (g.context() == 0) g.set_context(d.context());
  if (g.channels() == 0) g.set_channels(d.channels());
  if (g.heads() == 0) g.set_heads(d.heads());
  if (g.layers() == 0) g.set_layers(d.layers());
  GptConfig c;
  c.vocab = g.vocab();
  c.context = g.context();
  c.channels = g.channels();
  c.heads = g.heads();
  c.layers = g.layers();
  check_gpt_sizes(c, "model.gpt");
  return c;
}

MlpConfig resolve_mlp(const proto::MlpModelConfig& m) {
  if (m.dims_size() < 2) {
    MP_THROW(ConfigError, "model.mlp.dims has ", m.dims_size(), " entr", m.dims_size() == 1 ? "y" : "ies",
             ": need at least 2 (input width, hidden widths..., classes)");
  }
  check_size_at_most("model.mlp.dims entries", m.dims_size(), kMaxModelLayers + 1);
  double params = 0;
  for (int i = 0; i < m.dims_size(); ++i) {
    if (m.dims(i) <= 0) MP_THROW(ConfigError, "model.mlp.dims[", i, "] = ", m.dims(i), ": must be positive");
    check_size_at_most("model.mlp.dims[" + std::to_string(i) + "]", m.dims(i), kMaxModelWidth);
    if (i > 0) params += static_cast<double>(m.dims(i - 1) + 1) * static_cast<double>(m.dims(i));
  }
  check_model_params("model.mlp", params);
  MlpConfig c;
  c.dims.assign(m.dims().begin(), m.dims().end());
  return c;
}

// data: the cross-field rules listed at resolve_train_config.
void resolve_data(const proto::TrainConfig& config, ModelKind model) {
  const proto::DataConfig& d = config.data();
  check_positive("data.micro_batch_size", d.micro_batch_size());
  const bool has_train = !d.train_path().empty();
  if (!(d.val_fraction() >= 0.0 && d.val_fraction() < 1.0)) {
    MP_THROW(ConfigError, "data.val_fraction = ", d.val_fraction(), ": must be in [0, 1)");
  }
  if (d.val_fraction() > 0.0 && !has_train) {
    MP_THROW(ConfigError, "data.val_fraction = ", d.val_fraction(),
             " needs data.train_path: it holds out the end of the training file");
  }
  if (d.val_fraction() > 0.0 && !d.val_path().empty()) {
    MP_THROW(ConfigError, "data.val_fraction = ", d.val_fraction(), " and data.val_path = '", d.val_path(),
             "' are both set: validate on one or the other");
  }
  if (!d.val_path().empty() && !has_train) {
    MP_THROW(ConfigError, "data.val_path = '", d.val_path(),
             "' needs data.train_path (without it the run trains and validates on the synthetic data)");
  }
  if (has_train && config.val_interval() > 0 && d.val_path().empty() && d.val_fraction() == 0.0) {
    MP_THROW(ConfigError, "val_interval = ", config.val_interval(), " but data.train_path has no validation tokens: "
             "set data.val_path or data.val_fraction, or val_interval: 0");
  }
  if (model == ModelKind::kMlp && has_train) {
    MP_THROW(ConfigError, "data.train_path = '", d.train_path(),
             "': token files feed model.gpt; the MLP trains on its own synthetic data (models/mlp.h)");
  }
}

void resolve_compute(const proto::ComputeConfig& c, TrainSettings& s) {
  check_not_negative("compute.threads", c.threads());
  if (!proto::DataType_IsValid(c.matmul_dtype())) {
    MP_THROW(ConfigError, "compute.matmul_dtype = ", static_cast<int>(c.matmul_dtype()), ": not a value of ",
             proto::DataType_descriptor()->full_name(), "; valid: ", enum_value_names(*proto::DataType_descriptor()));
  }
  for (int i = 0; i < c.fp32_ops_size(); ++i) {
    try {
      s.fp32_ops.emplace_back(c.fp32_ops(i), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      MP_THROW(ConfigError, "compute.fp32_ops[", i, "] = '", c.fp32_ops(i), "': not a valid ECMAScript regex (",
               e.what(), ")");
    }
  }
}

// model: exactly one of gpt and mlp.
void resolve_model(proto::TrainConfig& c, TrainSettings& s) {
  switch (c.model().kind_case()) {
    case proto::ModelConfig::kGpt:
      s.model = ModelKind::kGpt;
      s.gpt = resolve_gpt(*c.mutable_model()->mutable_gpt());
      return;
    case proto::ModelConfig::kMlp:
      s.model = ModelKind::kMlp;
      s.mlp = resolve_mlp(c.model().mlp());
      return;
    case proto::ModelConfig::KIND_NOT_SET:
      break;
  }
  MP_THROW(ConfigError, "model is not set: the config needs model { gpt { ... } } or model { mlp { ... } }");
}

// steps, the log, validation and sampling intervals, with their defaults.
void resolve_schedule(proto::TrainConfig& c, ModelKind model) {
  check_positive("steps", c.steps());
  check_not_negative("log_interval", c.log_interval());
  if (c.log_interval() == 0) c.set_log_interval(1);
  check_not_negative("val_interval", c.val_interval());
  check_not_negative("val_batches", c.val_batches());
  if (c.val_batches() == 0) c.set_val_batches(4);
  check_not_negative("sample_interval", c.sample_interval());
  check_not_negative("sample_tokens", c.sample_tokens());
  if (c.sample_tokens() == 0) c.set_sample_tokens(64);
  if (c.sample_interval() > 0) {
    if (model != ModelKind::kGpt) {
      MP_THROW(ConfigError, "sample_interval = ", c.sample_interval(), ": text samples need model.gpt");
    }
    if (c.sample_tokens() > c.model().gpt().context()) {
      MP_THROW(ConfigError, "sample_tokens = ", c.sample_tokens(), " exceeds model.gpt.context = ",
               c.model().gpt().context());
    }
  }
}

// checkpoint: intervals, keep_last, the directory and whether the run saves,
// resume, and the Hugging Face import and export (GPT only).
void resolve_checkpoint(const proto::TrainConfig& c, TrainSettings& s) {
  const proto::CheckpointConfig& k = c.checkpoint();
  check_not_negative("checkpoint.interval_steps", k.interval_steps());
  if (!(k.interval_minutes() >= 0) || !std::isfinite(k.interval_minutes())) {
    MP_THROW(ConfigError, "checkpoint.interval_minutes = ", k.interval_minutes(), ": must be finite and >= 0");
  }
  check_not_negative("checkpoint.keep_last", k.keep_last());
  s.checkpoint_keep_last = k.keep_last() > 0 ? k.keep_last() : 3;
  s.checkpoint_dir = !k.dir().empty() ? k.dir() : c.out_dir().empty() ? "" : c.out_dir() + "/checkpoints";
  const bool asked = k.interval_steps() > 0 || k.interval_minutes() > 0 || k.save_at_end();
  if (asked && s.checkpoint_dir.empty()) {
    MP_THROW(ConfigError, "checkpoint.",
             k.interval_steps() > 0 ? "interval_steps" : k.interval_minutes() > 0 ? "interval_minutes" : "save_at_end",
             " is set but there is nowhere to save: set checkpoint.dir or out_dir");
  }
  s.checkpoint_saves = !s.checkpoint_dir.empty() && (asked || k.save_on_signal() || !k.has_save_on_signal());
  if (k.resume() == "auto" && s.checkpoint_dir.empty()) {
    MP_THROW(ConfigError, "checkpoint.resume = 'auto' looks under checkpoint.dir (or out_dir/checkpoints); neither is set");
  }
  const bool gpt = s.model == ModelKind::kGpt;
  if (!k.init_from_safetensors().empty() && !gpt) {
    MP_THROW(ConfigError, "checkpoint.init_from_safetensors: Hugging Face GPT-2 weights need model.gpt");
  }
  if (!k.export_safetensors().empty() && !gpt) {
    MP_THROW(ConfigError, "checkpoint.export_safetensors: Hugging Face GPT-2 export needs model.gpt");
  }
  if (k.export_dtype() != proto::DATA_TYPE_UNSET && k.export_dtype() != proto::FP32 && k.export_dtype() != proto::BF16) {
    MP_THROW(ConfigError, "checkpoint.export_dtype = ", proto::DataType_Name(k.export_dtype()), ": FP32 or BF16");
  }
}

// The model's run fields: micro_batch_size, data_seed and threads.
void fill_model_run(const proto::TrainConfig& c, TrainSettings& s) {
  const auto fill = [&c](auto& model) {
    model.micro_batch_size = c.data().micro_batch_size();
    model.data_seed = c.data().seed();
    model.threads = c.compute().threads();
    validate(model);  // a backstop: the checks above cover it
  };
  s.model == ModelKind::kGpt ? fill(s.gpt) : fill(s.mlp);
}

}  // namespace

// ---- the base -------------------------------------------------------------------

const char* default_train_config_text() { return kDefaultConfigText; }

proto::TrainConfig default_train_config() {
  // Parsed once; the copy returned is the caller's.
  static const proto::TrainConfig parsed = parse_train_config(kDefaultConfigText, kDefaultConfigName);
  return parsed;
}

proto::TrainConfig parse_train_config(const std::string& text, const std::string& source_name) {
  proto::TrainConfig config;
  parse_text_proto(text, source_name, config);
  return config;
}

proto::TrainConfig load_train_config(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    MP_THROW(IoError, "train config '", path, "': is a directory, not a file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) MP_THROW(IoError, "train config '", path, "': cannot open: ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) MP_THROW(IoError, "train config '", path, "': cannot read: ", std::strerror(errno));
  return parse_train_config(text.str(), path);
}

// ---- overrides --------------------------------------------------------------------

void apply_override(proto::TrainConfig& config, const std::string& assignment) {
  apply_text_override(config, assignment, {"the config", "engine.optimizer.lr=3e-4"});
}

// ---- resolving ----------------------------------------------------------------------

DType TrainSettings::gpt_matmul_dtype() const {
  std::optional<DType> requested;
  switch (config.compute().matmul_dtype()) {
    case proto::FP32: requested = DType::kF32; break;
    case proto::BF16: requested = DType::kBF16; break;
    case proto::FP16: requested = DType::kF16; break;
    default: break;
  }
  return mp::gpt_matmul_dtype(requested, engine_options.precision.param_dtype);
}

bool TrainSettings::is_fp32_op(const std::string& op) const {
  for (const std::regex& re : fp32_ops) {
    if (std::regex_match(op, re)) return true;
  }
  return false;
}


TrainSettings resolve_train_config(const proto::TrainConfig& config, int world_size) {
  TrainSettings s;
  s.config = config;
  proto::TrainConfig& c = s.config;
  resolve_model(c, s);
  resolve_data(c, s.model);
  resolve_schedule(c, s.model);
  resolve_compute(c.compute(), s);
  resolve_checkpoint(c, s);
  s.engine_options = resolve_engine_options(c.engine(), world_size);
  fill_model_run(c, s);
  // Before any rank starts: a recomputation policy the model cannot follow.
  recomputed_units(s.model == ModelKind::kGpt ? Gpt::spec_for(s.gpt) : Mlp::spec_for(s.mlp),
                   s.engine_options.recompute_every);
  return s;
}

std::string to_text(const proto::TrainConfig& config) {
  pb::TextFormat::Printer printer;
  printer.SetUseShortRepeatedPrimitives(true);
  std::string text;
  MP_ENFORCE(printer.PrintToString(config, &text), "printing a TrainConfig");
  return text;
}

}  // namespace mp

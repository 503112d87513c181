// launch/train_config.h: mp_worker's training configuration (TrainConfig in
// proto/mp.proto): the embedded default, text-format config files,
// `field.path=value` overrides, and the one place a config is checked.
//
// Note [Config layering]
// A run's config is built in three steps:
//   1. A base: default_train_config() (configs/default.textproto, compiled
//      into the binary) or load_train_config(path). A file is a whole
//      config: it does NOT start from the embedded default, so a file says
//      everything there is, and a field it leaves unset means the default
//      written beside that field in proto/mp.proto (for most fields: 0).
//      One exception, documented in the proto: model.gpt's unset (zero)
//      fields take the embedded default's, so `model { gpt { layers: 6 } }`
//      is the default GPT with 6 layers.
//   2. Overrides, left to right: apply_override(config, "engine.optimizer.lr=3e-4").
//   3. resolve_train_config(config, world_size): every field and every
//      cross-field rule is checked here, once, and the documented defaults
//      are filled in. Code after it trusts the TrainSettings it returns.
// Errors are ConfigError naming where (file:line:column, or the full field
// path) and what is wrong; a file that cannot be read is IoError.
#pragma once

#include <regex>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "models/mlp.h"
#include "proto/mp.pb.h"
#include "runtime/engine_options.h"

namespace mp {

// ---- the base -------------------------------------------------------------------

// The TrainConfig text format's version (mp_worker --version prints it):
// raised when a field is removed or changes meaning, so an old config file
// can be recognized; adding fields keeps it.
inline constexpr int kTrainConfigFormatVersion = 1;

// configs/default.textproto as compiled into the binary (the build turns the
// file into a string literal, so the two are the same text). A small GPT on
// the synthetic language; see the file for what it trains.
proto::TrainConfig default_train_config();

// The text of configs/default.textproto as compiled in, comments included.
const char* default_train_config_text();

// Parses the text-format config at `path` (Note [Config layering]: the file
// is the whole config). Throws IoError naming the path when it cannot be
// read, and ConfigError "path:line:column: what" on a syntax error, an
// unknown field or a bad value, e.g.
//   configs/x.textproto:12:5: Message type "mp.proto.DataConfig" has no field named "micro_batchsize".
// Lines and columns count from 1. The column is protobuf's: at or just
// after the offending token (an unknown field name is reported where the
// ':' after it stands); a tab advances it to the next multiple of 8.
proto::TrainConfig load_train_config(const std::string& path);

// Parses text-format `text`; errors name `source_name` where load_train_config
// names the path.
proto::TrainConfig parse_train_config(const std::string& text, const std::string& source_name);

// ---- overrides --------------------------------------------------------------------

// Applies `assignment`, "field.path=value", to `config` through protobuf
// reflection (apply_text_override, formats/text_overrides.h). The path names
// fields from TrainConfig down by their proto names (engine.optimizer.lr,
// model.gpt.layers); the value is split at the first '=' and taken by the
// field's type:
//   integers    base 10, the whole value (no trailing text), within the
//               field's range: model.gpt.layers=6
//   floats      strtod syntax, finite: engine.optimizer.lr=3e-4
//   bool        true, false, 1 or 0 (case-insensitive): engine.deterministic=true
//   enum        a value name, case-insensitive, or its number:
//               engine.sharding.strategy=shard_grad_op, engine.precision.recipe=AMP_BF16
//   string      the value as written, spaces included: data.train_path=/x/y.bin
//   repeated    a comma-separated list that replaces the field:
//               model.mlp.dims=64,128,16; an empty value clears it. An
//               element of a repeated string cannot contain a comma here
//               (compute.fp32_ops=head,h0\..*); write such a regex in a file.
// Spaces around numbers, bools and enum names are ignored. Walking into a
// sub-message creates it, and walking into a oneof member selects it:
// model.gpt.layers=6 on an MLP config replaces the MLP by a GPT whose other
// fields are unset. A whole message (engine.optimizer=...) and a field inside
// a repeated message (engine.optimizer.param_groups) cannot be assigned.
// Throws ConfigError naming the full path and what is wrong (an unknown field
// lists the fields its message has; an unknown enum value lists the names);
// on error `config` is unchanged.
void apply_override(proto::TrainConfig& config, const std::string& assignment);

// ---- the resolved run ----------------------------------------------------------------

enum class ModelKind { kGpt, kMlp };

// What a run uses, after resolve_train_config.
struct TrainSettings {
  // The config with every default this file owns filled in: model.gpt's
  // zero fields, log_interval, val_batches and sample_tokens. Read plain
  // fields (steps, out_dir, data.train_path, ...) from here. `engine` is
  // kept as written; its resolved values are in `engine_options`.
  // to_text(config) is what the run directory records; resolving it again
  // gives the same settings.
  proto::TrainConfig config;
  EngineOptions engine_options;  // resolve_engine_options(config.engine(), world_size)
  ModelKind model = ModelKind::kGpt;
  // model == kGpt: the sizes, micro_batch_size = data.micro_batch_size,
  // data_seed = data.seed, threads = compute.threads (0: the caller's
  // default). model == kMlp: the same for mlp (dims). The other is left
  // default-constructed.
  GptConfig gpt;
  MlpConfig mlp;
  // compute.fp32_ops compiled as ECMAScript regexes, in order.
  std::vector<std::regex> fp32_ops;
  // Checkpoints (proto::CheckpointConfig): the directory (checkpoint.dir,
  // else out_dir + "/checkpoints", else empty: no checkpoints), whether
  // this run saves any (an interval, save_at_end or save_on_signal with a
  // directory), and keep_last with its default.
  std::string checkpoint_dir;
  bool checkpoint_saves = false;
  int checkpoint_keep_last = 3;
  // mp_worker --steps 0 --export-safetensors DIR: no step; the weights
  // restored (the init, imported weights or a checkpoint) are exported.
  bool export_only = false;

  // Whether the GEMM named `op` ("h3.attn.c_proj", "head") stays fp32: one
  // of fp32_ops matches the whole name.
  bool is_fp32_op(const std::string& op) const;
  // The GPT's GEMM input dtype: gpt_matmul_dtype (models/gpt.h) of
  // compute.matmul_dtype and engine_options' param_dtype.
  DType gpt_matmul_dtype() const;
};

// Checks `config` for a run on `world_size` ranks and fills the defaults
// (Note [Config layering]). Rules, each a ConfigError naming the field:
//   model: exactly one of gpt, mlp. gpt: every size positive after the
//     defaults, vocab at most 2^30, heads divides channels. mlp: at least 2
//     dims, each positive.
//   data: micro_batch_size > 0; val_fraction in [0, 1) and, when non-zero,
//     only with a train_path and no val_path; validation (val_interval > 0)
//     on a train_path needs a val_path or a val_fraction; a val_path needs
//     a train_path; the MLP reads no files (no train_path).
//   steps > 0; log_interval, val_interval, val_batches, sample_interval,
//     sample_tokens >= 0; sampling (sample_interval > 0) is GPT-only and
//     needs sample_tokens <= model.gpt.context.
//   compute: threads >= 0, matmul_dtype a known value, every fp32_ops entry
//     a valid regex.
//   engine: resolve_engine_options (runtime/engine_options.h); its errors
//     propagate as they are.
TrainSettings resolve_train_config(const proto::TrainConfig& config, int world_size);

// `config` in text format, parseable by parse_train_config; repeated scalars
// on one line (dims: [64, 128, 16]). For the run directory's config.textproto.
std::string to_text(const proto::TrainConfig& config);

}  // namespace mp

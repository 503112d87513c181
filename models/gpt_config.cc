// models/gpt_config.cc: the GPT's config rules, sizes, costs, GEMM op
// dtypes and units (models/gpt.h); the model itself is gpt.cc.
#include <algorithm>
#include <cmath>
#include <regex>
#include <string>
#include <utility>

#include "core/error.h"
#include "models/gpt.h"
#include "models/model_limits.h"

namespace mp {

// ---- config -------------------------------------------------------------------

void check_gpt_sizes(const GptConfig& config, const std::string& prefix) {
  const auto field = [&](const char* name) { return prefix + "." + name; };
  const std::pair<const char*, int64_t> sizes[] = {{"vocab", config.vocab},       {"context", config.context},
                                                   {"channels", config.channels}, {"heads", config.heads},
                                                   {"layers", config.layers}};
  for (const auto& [name, value] : sizes) {
    if (value <= 0) MP_THROW(ConfigError, field(name), " = ", value, ": must be positive");
  }
  constexpr int64_t kMaxVocab = int64_t{1} << 30;  // token ids are int32
  check_size_at_most(field("vocab"), config.vocab, kMaxVocab);
  check_size_at_most(field("context"), config.context, kMaxModelWidth);
  check_size_at_most(field("channels"), config.channels, kMaxModelWidth);
  check_size_at_most(field("layers"), config.layers, kMaxModelLayers);
  if (config.channels % config.heads != 0) {
    MP_THROW(ConfigError, field("heads"), " = ", config.heads, " does not divide ", field("channels"), " = ",
             config.channels);
  }
  check_model_params(prefix, gpt_parameter_count(config));
}

void validate(const GptConfig& config) {
  check_gpt_sizes(config, "gpt");
  if (config.micro_batch_size <= 0) {
    MP_THROW(ConfigError, "gpt.micro_batch_size = ", config.micro_batch_size, ": must be positive");
  }
  if (config.threads < 0) {
    MP_THROW(ConfigError, "gpt.threads = ", config.threads, ": must be 0 (default) or positive");
  }
  if (config.matmul_dtype != DType::kF32 && config.matmul_dtype != DType::kBF16) {
    MP_THROW(ConfigError, "compute.matmul_dtype = ", dtype_name(config.matmul_dtype), ": must be fp32 or bf16");
  }
  for (size_t k = 0; k < config.fp32_ops.size(); ++k) {
    try {
      const std::regex check(config.fp32_ops[k], std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      MP_THROW(ConfigError, "compute.fp32_ops[", k, "] = '", config.fp32_ops[k],
               "': not a valid regular expression (", e.what(), ")");
    }
  }
}

// ---- sizes and costs ----------------------------------------------------------

double gpt_parameter_count(const GptConfig& config) {
  // As gpt.cc lays them out: embeddings, then per layer two LayerNorms (4 C),
  // qkv (3 C^2 + 3 C), the attention projection (C^2 + C) and the MLP
  // (8 C^2 + 5 C), then the final LayerNorm.
  const auto C = static_cast<double>(config.channels);
  return static_cast<double>(config.vocab + config.context) * C +
         static_cast<double>(config.layers) * (12.0 * C * C + 13.0 * C) + 2.0 * C;
}

double gpt_train_flops_per_token(const GptConfig& config) {
  const auto C = static_cast<double>(config.channels);
  const double n = gpt_parameter_count(config) - static_cast<double>(config.context) * C;  // without wpe
  return 6 * n + 12 * static_cast<double>(config.layers) * C * static_cast<double>(config.context);
}

DType gpt_matmul_dtype(std::optional<DType> requested, DType param_dtype) {
  if (!requested) return param_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  if (*requested == DType::kF16) {
    MP_THROW(ConfigError, "compute.matmul_dtype = FP16: the CPU GEMMs take fp32 or bf16 inputs");
  }
  return *requested;
}

std::string gpt_describe(const GptConfig& config) {
  int fp32_ops = 0;
  for (DType d : gpt_matmul_op_dtypes(config)) fp32_ops += d == DType::kF32 ? 1 : 0;
  return detail::str("GPT-2 of ", Gpt::spec_for(config).numel(), " parameters (layers ", config.layers, ", channels ",
                     config.channels, ", heads ", config.heads, ", context ", config.context, ", vocab ",
                     config.vocab, "); GEMMs on ", dtype_name(config.matmul_dtype), " inputs",
                     config.matmul_dtype != DType::kF32 && fp32_ops > 0
                         ? detail::str(", ", fp32_ops, " kept fp32 (compute.fp32_ops)")
                         : std::string());
}

// ---- GEMM ops -----------------------------------------------------------------


std::vector<std::string> gpt_matmul_op_names(int64_t layers) {
  std::vector<std::string> names;
  for (int64_t l = 0; l < layers; ++l) {
    const std::string h = "h" + std::to_string(l);
    // The BlockOp order.
    for (const char* op : {".attn.c_attn", ".attn.c_proj", ".mlp.c_fc", ".mlp.c_proj"}) names.push_back(h + op);
  }
  names.emplace_back("head");
  return names;
}

std::vector<DType> gpt_matmul_op_dtypes(const GptConfig& config) {
  validate(config);
  std::vector<std::regex> fp32;
  for (const std::string& pattern : config.fp32_ops) fp32.emplace_back(pattern, std::regex::ECMAScript);
  std::vector<DType> dtypes;
  for (const std::string& name : gpt_matmul_op_names(config.layers)) {
    const bool keep =
        std::any_of(fp32.begin(), fp32.end(), [&](const std::regex& r) { return std::regex_match(name, r); });
    dtypes.push_back(keep ? DType::kF32 : config.matmul_dtype);
  }
  return dtypes;
}

int64_t gpt_padded_vocab(int64_t vocab) {
  return (vocab + kGptVocabMultiple - 1) / kGptVocabMultiple * kGptVocabMultiple;
}

// ---- units ----------------------------------------------------------------------

ModelSpec Gpt::spec_for(const GptConfig& config) {
  validate(config);
  using Kind = ParamInit::Kind;
  const int64_t c = config.channels;
  const ParamInit ones{Kind::kOnes, 0.0}, zeros{Kind::kZeros, 0.0}, normal{Kind::kNormal, 0.02};
  const ParamInit residual{Kind::kNormal, 0.02 / std::sqrt(2.0 * static_cast<double>(config.layers))};
  ModelSpec spec;
  spec.units.push_back(UnitSpec{"embed",
                                {ParamSpec{"wte", {gpt_padded_vocab(config.vocab), c}, normal},
                                 ParamSpec{"wpe", {config.context, c}, normal}},
                                /*backward_reads_params=*/false});  // Note [Tied head]
  // Note [Muon and the GPT] (optim/muon.h): Muon takes the blocks' 2-D
  // weights; the GPT stores them [in, out], so the lr shape is (out, in).
  auto matrix = [](std::string name, Shape shape, ParamInit init) {
    ParamSpec p{std::move(name), shape, init};
    p.muon = true;
    p.muon_lr_a = shape[1];
    p.muon_lr_b = shape[0];
    return p;
  };
  for (int64_t l = 0; l < config.layers; ++l) {
    const std::string h = "h" + std::to_string(l);
    // Declaration order is the BlockParam order.
    spec.units.push_back(UnitSpec{h,
                                  {ParamSpec{h + ".ln_1.weight", {c}, ones},
                                   ParamSpec{h + ".ln_1.bias", {c}, zeros},
                                   matrix(h + ".attn.c_attn.weight", {c, 3 * c}, normal),
                                   ParamSpec{h + ".attn.c_attn.bias", {3 * c}, zeros},
                                   matrix(h + ".attn.c_proj.weight", {c, c}, residual),
                                   ParamSpec{h + ".attn.c_proj.bias", {c}, zeros},
                                   ParamSpec{h + ".ln_2.weight", {c}, ones},
                                   ParamSpec{h + ".ln_2.bias", {c}, zeros},
                                   matrix(h + ".mlp.c_fc.weight", {c, 4 * c}, normal),
                                   ParamSpec{h + ".mlp.c_fc.bias", {4 * c}, zeros},
                                   matrix(h + ".mlp.c_proj.weight", {4 * c, c}, residual),
                                   ParamSpec{h + ".mlp.c_proj.bias", {c}, zeros}},
                                  /*backward_reads_params=*/true,
                                  /*recomputable=*/true});  // Note [GPT recomputation]
  }
  spec.units.push_back(UnitSpec{"head", {ParamSpec{"ln_f.weight", {c}, ones}, ParamSpec{"ln_f.bias", {c}, zeros}}});
  return spec;
}

}  // namespace mp

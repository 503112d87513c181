#include "models/gpt_hf.h"

#include <sys/stat.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"
#include "formats/safetensors.h"
#include "models/flat_layout.h"

namespace mp {
namespace {

using Json = nlohmann::json;

constexpr char kModelFile[] = "model.safetensors";
constexpr char kConfigFile[] = "config.json";
constexpr char kPrefix[] = "transformer.";
constexpr int64_t kGpt2Vocab = 50257;       // GPT-2's tokenizer
constexpr int64_t kGpt2EndOfText = 50256;   // its <|endoftext|>, bos and eos
constexpr int64_t kMaxConfigBytes = 1 << 24;

// One parameter of our GPT and the tensor that holds it in a GPT-2 file.
struct HfParam {
  std::string ours, hf;
  Shape our_shape, hf_shape;
};

std::vector<HfParam> hf_params(const GptConfig& config) {
  std::vector<HfParam> out;
  for (const UnitSpec& unit : Gpt::spec_for(config).units) {
    for (const ParamSpec& p : unit.params) {
      Shape hf_shape = p.shape;
      if (p.name == "wte") hf_shape[0] = config.vocab;
      out.push_back(HfParam{p.name, gpt_hf_name(p.name), p.shape, std::move(hf_shape)});
    }
  }
  return out;
}

std::string describe(const GptConfig& c) {
  return detail::str("vocab ", c.vocab, ", context ", c.context, ", channels ", c.channels, ", heads ", c.heads,
                     ", layers ", c.layers);
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

const char* torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    default: break;
  }
  MP_THROW(ConfigError, "GPT-2 export: dtype ", dtype_name(dtype), " is not one transformers loads (fp32, bf16, fp16)");
}

// Checks a config.json beside an imported file against `config`, where it
// has the fields (a file without config.json is fine: only shapes are checked).
void check_hf_config(const std::string& path, const GptConfig& config) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return;
  const auto size = static_cast<int64_t>(in.tellg());
  if (size < 0 || size > kMaxConfigBytes) {
    MP_THROW(ConfigError, "GPT-2 config '", path, "': ", size, " bytes, not a config.json (limit ", kMaxConfigBytes, ")");
  }
  in.seekg(0);
  std::string text(static_cast<size_t>(size), '\0');
  if (!in.read(text.data(), size)) MP_THROW(IoError, "GPT-2 config '", path, "': cannot read ", size, " bytes");
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    MP_THROW(ConfigError, "GPT-2 config '", path, "': not valid JSON: ", e.what());
  }
  if (!j.is_object()) MP_THROW(ConfigError, "GPT-2 config '", path, "': not a JSON object");
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", config.vocab}, {"n_embd", config.channels}, {"n_layer", config.layers}, {"n_head", config.heads}};
  for (const auto& [field, want] : sizes) {
    if (!j.contains(field)) continue;
    const Json& v = j.at(field);
    if (!v.is_number_integer() || v.get<int64_t>() != want) {
      MP_THROW(ConfigError, "GPT-2 config '", path, "': ", field, " = ", v.dump(), ", but the model config has ", want,
               " (", describe(config), ")");
    }
  }
  if (j.contains("activation_function")) {
    const Json& v = j.at("activation_function");
    if (v != "gelu_new" && v != "gelu_pytorch_tanh") {
      MP_THROW(ConfigError, "GPT-2 config '", path, "': activation_function = ", v.dump(),
               ", but our GPT computes the tanh GELU (\"gelu_new\")");
    }
  }
  if (j.contains("layer_norm_epsilon")) {
    const Json& v = j.at("layer_norm_epsilon");
    if (!v.is_number() || std::abs(v.get<double>() - 1e-5) > 1e-12) {
      MP_THROW(ConfigError, "GPT-2 config '", path, "': layer_norm_epsilon = ", v.dump(), ", but our GPT uses 1e-05");
    }
  }
  const std::pair<const char*, bool> flags[] = {{"scale_attn_weights", true},
                                                {"scale_attn_by_inverse_layer_idx", false}};
  for (const auto& [field, want] : flags) {
    if (j.contains(field) && j.at(field) != want) {
      MP_THROW(ConfigError, "GPT-2 config '", path, "': ", field, " = ", j.at(field).dump(), ", but our GPT computes ",
               field, " = ", want ? "true" : "false");
    }
  }
}

bool is_float_dtype(const std::string& dtype) {
  return dtype == "F32" || dtype == "BF16" || dtype == "F16" || dtype == "F64" || dtype == "F8_E4M3" ||
         dtype == "F8_E5M2";
}

}  // namespace

std::string gpt_hf_name(const std::string& name) {
  if (name == "wte" || name == "wpe") return name + ".weight";
  if (name == "ln_f.weight" || name == "ln_f.bias") return name;
  // h{i}.REST -> h.{i}.REST
  size_t digits = 1;
  while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) ++digits;
  if (name.size() > 2 && name[0] == 'h' && digits > 1 && digits < name.size() && name[digits] == '.') {
    return "h." + name.substr(1);
  }
  MP_THROW(ConfigError, "'", name, "' is not a parameter of our GPT (models/gpt.h)");
}

std::string gpt_hf_config_json(const GptConfig& config, DType dtype) {
  validate(config);
  const Json special = config.vocab == kGpt2Vocab ? Json(kGpt2EndOfText) : Json(nullptr);
  const Json j = {
      {"model_type", "gpt2"},
      {"architectures", {"GPT2LMHeadModel"}},
      {"vocab_size", config.vocab},
      {"n_positions", config.context},
      {"n_ctx", config.context},
      {"n_embd", config.channels},
      {"n_layer", config.layers},
      {"n_head", config.heads},
      {"n_inner", nullptr},  // 4 n_embd
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", 1e-5},
      {"initializer_range", 0.02},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", true},
      {"use_cache", true},
      {"bos_token_id", special},
      {"eos_token_id", special},
      {"torch_dtype", torch_dtype_name(dtype)},
  };
  return j.dump(2) + "\n";
}

void export_gpt_hf(const std::string& dir, const GptConfig& config,
                   const std::function<std::vector<float>(const std::string& name)>& weights, DType dtype) {
  const std::string config_text = gpt_hf_config_json(config, dtype);  // validates config and dtype
  std::vector<SafetensorsTensor> tensors;
  for (const HfParam& p : hf_params(config)) {
    std::vector<float> values = weights(p.ours);
    if (static_cast<int64_t>(values.size()) != shape_numel(p.our_shape)) {
      MP_THROW(ConfigError, "GPT-2 export to '", dir, "': parameter '", p.ours, "' has ", values.size(),
               " values, but its shape ", shape_string(p.our_shape), " has ", shape_numel(p.our_shape));
    }
    values.resize(static_cast<size_t>(shape_numel(p.hf_shape)));  // wte: only the real vocabulary's rows
    tensors.push_back(make_safetensors_tensor(p.hf, p.hf_shape, values, dtype));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) MP_THROW(IoError, "GPT-2 export: cannot create directory '", dir, "': ", ec.message());
  write_safetensors(dir + "/" + kModelFile, tensors, {{"format", "pt"}});
  write_file_atomic(dir + "/" + kConfigFile, config_text, "GPT-2 config");
}

std::map<std::string, std::vector<float>> import_gpt_hf(const std::string& path_or_dir, const GptConfig& config) {
  const std::vector<HfParam> params = hf_params(config);  // validates config
  const bool dir = is_dir(path_or_dir);
  const std::string path = dir ? path_or_dir + "/" + kModelFile : path_or_dir;
  check_hf_config((dir ? path_or_dir : parent_dir(path)) + "/" + kConfigFile, config);

  std::map<std::string, const HfParam*> by_hf;
  for (const HfParam& p : params) by_hf.emplace(p.hf, &p);
  const auto strip = [](const std::string& name) {
    return name.rfind(kPrefix, 0) == 0 ? name.substr(std::strlen(kPrefix)) : name;
  };
  SafetensorsReadOptions options;
  options.load = [&](const std::string& name) {
    const std::string key = strip(name);
    return by_hf.count(key) > 0 || key == "lm_head.weight";
  };
  SafetensorsFile file = read_safetensors(path, options);

  const std::regex mask_buffer(R"(h\.[0-9]+\.attn\.(masked_)?bias)");
  const std::string where = "GPT-2 file '" + path + "'";
  std::map<std::string, SafetensorsEntry*> found;  // HF name without prefix -> tensor
  SafetensorsEntry* lm_head = nullptr;
  for (auto& [name, entry] : file.tensors) {
    const std::string key = strip(name);
    if (std::regex_match(key, mask_buffer)) continue;  // attention mask buffers, not parameters
    SafetensorsEntry** slot = nullptr;
    if (by_hf.count(key) > 0) {
      slot = &found[key];
    } else if (key == "lm_head.weight") {
      slot = &lm_head;
    } else {
      MP_THROW(ConfigError, where, ": tensor '", name, "' is not a parameter of a GPT-2 of ", describe(config));
    }
    if (*slot != nullptr) {
      MP_THROW(ConfigError, where, ": tensor '", key, "' is there both with and without the '", kPrefix, "' prefix");
    }
    if (!is_float_dtype(entry.dtype)) {
      MP_THROW(ConfigError, where, ": tensor '", name, "' has dtype ", entry.dtype, ", not a floating-point type");
    }
    *slot = &entry;
  }

  std::map<std::string, std::vector<float>> out;
  for (const HfParam& p : params) {
    const auto it = found.find(p.hf);
    if (it == found.end()) {
      MP_THROW(ConfigError, where, ": no tensor '", p.hf, "' (expected shape ", shape_string(p.hf_shape), ", for ",
               describe(config), ")");
    }
    SafetensorsEntry& t = *it->second;
    // wpe may hold more positions than the context (GPT-2 has 1024): the first ones are used.
    const bool shape_ok = p.ours == "wpe" ? t.shape.size() == 2 && t.shape[0] >= p.hf_shape[0] &&
                                                t.shape[1] == p.hf_shape[1]
                                          : t.shape == p.hf_shape;
    if (!shape_ok) {
      MP_THROW(ConfigError, where, ": tensor '", p.hf, "' has shape ", shape_string(t.shape), ", expected ",
               shape_string(p.hf_shape), p.ours == "wpe" ? " or more rows" : "", " (", describe(config), ")");
    }
    std::vector<float> values = p.ours == "wte" ? t.values : std::move(t.values);
    values.resize(static_cast<size_t>(shape_numel(p.our_shape)), 0.0f);  // wte: zero padding rows; wpe: first rows
    out.emplace(p.ours, std::move(values));
  }
  if (lm_head != nullptr) {
    // Our head is wte itself: only a tied copy can be imported.
    const SafetensorsEntry& wte = *found.at("wte.weight");
    if (lm_head->shape != wte.shape || lm_head->values != wte.values) {
      MP_THROW(ConfigError, where, ": lm_head.weight ", shape_string(lm_head->shape),
               " differs from wte.weight; our GPT ties the head to wte, so an untied head cannot be imported");
    }
  }
  return out;
}

}  // namespace mp

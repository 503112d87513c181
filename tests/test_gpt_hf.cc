// The GPT-2 export and import (models/gpt_hf.h): our names map to
// transformers' GPT2 names, exact round trips in fp32 and bf16, the forms
// transformers writes are read, what does not fit the config is named, and
// (where a Python with torch and transformers is given) transformers
// computes our logits from our export (tests/check_hf_export.py).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "kernels/convert_math.h"
#include "models/flat_layout.h"
#include "models/gpt.h"
#include "models/gpt_hf.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

#ifndef MP_TEST_GOLDEN_DIR
#error "MP_TEST_GOLDEN_DIR (tests/golden) must be defined by the build"
#endif

namespace mp {
namespace {

using Json = nlohmann::json;
using math::f32_bits;
using testing::error_of;
using testing::random_values;
using testing::read_bytes;
using testing::TempDirTest;
using testing::write_bytes;

class GptHf : public TempDirTest {
 protected:
  // Weights of every parameter in our layout, wte's padding rows nonzero.
  static std::map<std::string, std::vector<float>> weights_for(const GptConfig& c, uint32_t seed) {
    std::map<std::string, std::vector<float>> w;
    uint32_t k = seed;
    for (const UnitSpec& unit : Gpt::spec_for(c).units) {
      for (const ParamSpec& p : unit.params) w[p.name] = random_values(static_cast<size_t>(shape_numel(p.shape)), k++, 0.3f);
    }
    return w;
  }
  static std::function<std::vector<float>(const std::string&)> lookup(const std::map<std::string, std::vector<float>>& w) {
    return [&w](const std::string& name) { return w.at(name); };
  }
  // The GPT-2 tensors of `w` by Hugging Face name (wte without padding rows).
  static std::vector<SafetensorsTensor> hf_tensors(const GptConfig& c, const std::map<std::string, std::vector<float>>& w,
                                                   const std::string& prefix = "") {
    std::vector<SafetensorsTensor> out;
    for (const UnitSpec& unit : Gpt::spec_for(c).units) {
      for (const ParamSpec& p : unit.params) {
        std::vector<float> v = w.at(p.name);
        Shape shape = p.shape;
        if (p.name == "wte") shape[0] = c.vocab;
        v.resize(static_cast<size_t>(shape_numel(shape)));
        out.push_back(make_safetensors_tensor(prefix + gpt_hf_name(p.name), shape, v, DType::kF32));
      }
    }
    return out;
  }

  const GptConfig config_ = testing::small_gpt(100);
};

TEST_F(GptHf, OurNamesMapToTransformersGpt2Names) {
  EXPECT_EQ(gpt_hf_name("wte"), "wte.weight");
  EXPECT_EQ(gpt_hf_name("wpe"), "wpe.weight");
  EXPECT_EQ(gpt_hf_name("h0.ln_1.weight"), "h.0.ln_1.weight");
  EXPECT_EQ(gpt_hf_name("h11.attn.c_attn.weight"), "h.11.attn.c_attn.weight");
  EXPECT_EQ(gpt_hf_name("h3.mlp.c_proj.bias"), "h.3.mlp.c_proj.bias");
  EXPECT_EQ(gpt_hf_name("ln_f.bias"), "ln_f.bias");
  EXPECT_THROW(gpt_hf_name("lm_head.weight"), ConfigError);
  EXPECT_THROW(gpt_hf_name("h.0.ln_1.weight"), ConfigError);
  EXPECT_THROW(gpt_hf_name("h"), ConfigError);
}

TEST_F(GptHf, ExportThenImportIsExactAndDropsThePaddingRows) {
  const auto w = weights_for(config_, 10);
  const std::string out = path("export/f32");  // parents are created
  export_gpt_hf(out, config_, lookup(w), DType::kF32);

  const SafetensorsFile f = read_safetensors(out + "/model.safetensors");
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(f.tensors.size(), 2u + 12u * 2u + 2u);
  EXPECT_EQ(f.tensors.at("wte.weight").shape, (Shape{100, 16}));
  EXPECT_EQ(f.tensors.at("wpe.weight").shape, (Shape{8, 16}));
  EXPECT_EQ(f.tensors.at("h.1.attn.c_attn.weight").shape, (Shape{16, 48}));
  EXPECT_EQ(f.tensors.at("h.1.mlp.c_proj.weight").shape, (Shape{64, 16}));
  EXPECT_EQ(f.tensors.count("lm_head.weight"), 0u);
  for (const auto& [name, t] : f.tensors) EXPECT_EQ(t.dtype, "F32") << name;

  const Json cfg = Json::parse(read_bytes(out + "/config.json"));
  EXPECT_EQ(cfg.at("model_type"), "gpt2");
  EXPECT_EQ(cfg.at("architectures"), Json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(cfg.at("vocab_size"), 100);
  EXPECT_EQ(cfg.at("n_positions"), 8);
  EXPECT_EQ(cfg.at("n_ctx"), 8);
  EXPECT_EQ(cfg.at("n_embd"), 16);
  EXPECT_EQ(cfg.at("n_layer"), 2);
  EXPECT_EQ(cfg.at("n_head"), 2);
  EXPECT_EQ(cfg.at("activation_function"), "gelu_new");
  EXPECT_EQ(cfg.at("layer_norm_epsilon"), 1e-5);
  EXPECT_EQ(cfg.at("tie_word_embeddings"), true);
  EXPECT_EQ(cfg.at("resid_pdrop"), 0.0);
  EXPECT_EQ(cfg.at("torch_dtype"), "float32");
  EXPECT_TRUE(cfg.at("eos_token_id").is_null());

  // Import from the directory and from the file itself.
  for (const std::string& from : {out, out + "/model.safetensors"}) {
    const auto got = import_gpt_hf(from, config_);
    ASSERT_EQ(got.size(), w.size());
    for (const auto& [name, values] : w) {
      const std::vector<float>& g = got.at(name);
      ASSERT_EQ(g.size(), values.size()) << name;
      const size_t real = name == "wte" ? static_cast<size_t>(100 * 16) : values.size();
      for (size_t i = 0; i < g.size(); ++i) {
        const uint32_t want = i < real ? f32_bits(values[i]) : 0u;  // padding rows import as +0
        ASSERT_EQ(f32_bits(g[i]), want) << name << "[" << i << "] from " << from;
      }
    }
  }
}

TEST_F(GptHf, Bf16ExportImportsTheRoundedWeights) {
  const auto w = weights_for(config_, 20);
  export_gpt_hf(path("bf16"), config_, lookup(w), DType::kBF16);
  EXPECT_EQ(Json::parse(read_bytes(path("bf16/config.json"))).at("torch_dtype"), "bfloat16");
  const auto got = import_gpt_hf(path("bf16"), config_);
  for (const auto& [name, values] : w) {
    const size_t real = name == "wte" ? static_cast<size_t>(100 * 16) : values.size();
    for (size_t i = 0; i < real; ++i) {
      ASSERT_EQ(f32_bits(got.at(name)[i]), f32_bits(math::to_f32(math::from_f32<bf16>(values[i])))) << name << "[" << i << "]";
    }
  }
  EXPECT_THROW(export_gpt_hf(path("fp8"), config_, lookup(w), DType::kF8E4M3), ConfigError);
}

TEST_F(GptHf, ImportTakesTransformersPrefixesBuffersTiedHeadAndLongerWpe) {
  const auto w = weights_for(config_, 30);
  std::vector<SafetensorsTensor> tensors = hf_tensors(config_, w, "transformer.");
  // What GPT2LMHeadModel.save_pretrained and older checkpoints add: a tied
  // head copy, the causal-mask buffers, and wpe with more positions.
  const SafetensorsTensor wte = tensors.front();
  ASSERT_EQ(wte.name, "transformer.wte.weight");
  tensors.push_back(SafetensorsTensor{"lm_head.weight", wte.dtype, wte.shape, wte.bytes});
  tensors.push_back(make_safetensors_tensor("transformer.h.0.attn.bias", {1, 1, 8, 8}, std::vector<float>(64, 1.0f),
                                            DType::kF32));
  tensors.push_back(make_safetensors_tensor("transformer.h.1.attn.masked_bias", {}, {-1e4f}, DType::kF32));
  for (SafetensorsTensor& t : tensors) {
    if (t.name == "transformer.wpe.weight") {
      std::vector<float> longer = w.at("wpe");
      longer.resize(12 * 16, 5.0f);
      t = make_safetensors_tensor(t.name, {12, 16}, longer, DType::kF32);
    }
  }
  const std::string p = path("prefixed.safetensors");
  write_safetensors(p, tensors, {{"format", "pt"}});
  const auto got = import_gpt_hf(p, config_);
  EXPECT_EQ(got.at("wpe"), w.at("wpe"));
  EXPECT_EQ(got.at("h1.mlp.c_fc.bias"), w.at("h1.mlp.c_fc.bias"));
  EXPECT_EQ(std::vector<float>(got.at("wte").begin(), got.at("wte").begin() + 1600),
            std::vector<float>(w.at("wte").begin(), w.at("wte").begin() + 1600));
}

TEST_F(GptHf, ImportNamesWhatDoesNotFitTheConfig) {
  const auto w = weights_for(config_, 40);
  const auto import_error = [&](const std::string& name, const std::vector<SafetensorsTensor>& tensors) {
    const std::string p = path(name + ".safetensors");
    write_safetensors(p, tensors, {{"format", "pt"}});
    return error_of<ConfigError>([&] { import_gpt_hf(p, config_); });
  };
  const std::string where = "GPT-2 file '" + path("");
  const std::string cfg = "(vocab 100, context 8, channels 16, heads 2, layers 2)";

  std::vector<SafetensorsTensor> missing = hf_tensors(config_, w);
  const std::string missing_name = missing[3].name;  // h.0.ln_1.bias
  missing.erase(missing.begin() + 3);
  EXPECT_EQ(import_error("missing", missing), where + "missing.safetensors': no tensor '" + missing_name +
                                                  "' (expected shape [16], for " + cfg.substr(1, cfg.size() - 2) + ")");

  std::vector<SafetensorsTensor> wrong_vocab = hf_tensors(config_, w);
  for (SafetensorsTensor& t : wrong_vocab) {
    if (t.name == "wte.weight") t = make_safetensors_tensor(t.name, {128, 16}, w.at("wte"), DType::kF32);
  }
  EXPECT_EQ(import_error("vocab", wrong_vocab),
            where + "vocab.safetensors': tensor 'wte.weight' has shape [128, 16], expected [100, 16] " + cfg);

  std::vector<SafetensorsTensor> short_wpe = hf_tensors(config_, w);
  for (SafetensorsTensor& t : short_wpe) {
    if (t.name == "wpe.weight") t = make_safetensors_tensor(t.name, {4, 16}, std::vector<float>(64, 0.0f), DType::kF32);
  }
  EXPECT_EQ(import_error("wpe", short_wpe),
            where + "wpe.safetensors': tensor 'wpe.weight' has shape [4, 16], expected [8, 16] or more rows " + cfg);

  std::vector<SafetensorsTensor> extra_layer = hf_tensors(config_, w);
  extra_layer.push_back(make_safetensors_tensor("h.2.ln_1.weight", {16}, std::vector<float>(16, 1.0f), DType::kF32));
  EXPECT_EQ(import_error("layers", extra_layer), where + "layers.safetensors': tensor 'h.2.ln_1.weight' is not a "
                                                         "parameter of a GPT-2 of " + cfg.substr(1, cfg.size() - 2));

  std::vector<SafetensorsTensor> both = hf_tensors(config_, w);
  both.push_back(make_safetensors_tensor("transformer.ln_f.bias", {16}, std::vector<float>(16, 0.0f), DType::kF32));
  EXPECT_EQ(import_error("both", both), where + "both.safetensors': tensor 'ln_f.bias' is there both with and "
                                                "without the 'transformer.' prefix");

  std::vector<SafetensorsTensor> untied = hf_tensors(config_, w);
  untied.push_back(make_safetensors_tensor("lm_head.weight", {100, 16}, std::vector<float>(1600, 0.5f), DType::kF32));
  EXPECT_EQ(import_error("untied", untied),
            where + "untied.safetensors': lm_head.weight [100, 16] differs from wte.weight; our GPT ties the head to "
                    "wte, so an untied head cannot be imported");

  // A config.json beside the file must agree on what shapes cannot show.
  export_gpt_hf(path("heads"), config_, lookup(w), DType::kF32);
  GptConfig four_heads = config_;
  four_heads.heads = 4;
  EXPECT_EQ(error_of<ConfigError>([&] { import_gpt_hf(path("heads"), four_heads); }),
            "GPT-2 config '" + path("heads/config.json") +
                "': n_head = 2, but the model config has 4 (vocab 100, context 8, channels 16, heads 4, layers 2)");
  Json cfg_json = Json::parse(read_bytes(path("heads/config.json")));
  cfg_json["activation_function"] = "relu";
  write_bytes(path("heads/config.json"), cfg_json.dump());
  EXPECT_NE(error_of<ConfigError>([&] { import_gpt_hf(path("heads"), config_); }).find("activation_function = \"relu\""),
            std::string::npos);
  write_bytes(path("heads/config.json"), "{oops");
  EXPECT_NE(error_of<ConfigError>([&] { import_gpt_hf(path("heads"), config_); }).find("config.json': not valid JSON"),
            std::string::npos);
  EXPECT_THROW(import_gpt_hf(path("nothing"), config_), IoError);
}

// transformers loads our export and computes our logits. Runs where
// MP_HF_CHECK_PYTHON names a Python with torch and transformers (e.g. a venv
// with `pip install torch transformers safetensors`); skipped otherwise, or
// when the script reports them missing (exit 77). MP_HF_CHECK_DIR, if set,
// keeps the exports and the logits there instead of a temporary directory.
// Both dtypes: fp32 weights, and bf16 weights against our forward on the
// same weights rounded to bf16 (transformers widens them to fp32 exactly).
// Measured (transformers 5.23, torch 2.15 CPU): max |logit difference|
// 6e-7 (fp32) and 8e-7 (bf16) for logits up to 2.4.
TEST_F(GptHf, TransformersComputesOurLogitsFromTheExport) {
  const char* python = std::getenv("MP_HF_CHECK_PYTHON");
  if (python == nullptr || python[0] == '\0') GTEST_SKIP() << "MP_HF_CHECK_PYTHON is not set";
  const char* keep = std::getenv("MP_HF_CHECK_DIR");
  const std::string root = keep != nullptr && keep[0] != '\0' ? std::string(keep) : path("hf");
  const std::string script = std::string(MP_TEST_GOLDEN_DIR) + "/../check_hf_export.py";

  // Weights large enough that attention and GELU are far from linear; wte's padding rows nonzero.
  const GptConfig& c = config_;
  const FlatLayout layout(Gpt::spec_for(c), 1);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    testing::Units32 units = testing::init_params(layout, 77, 10.0f, 0.2f);
    if (dtype == DType::kBF16) {
      for (auto& unit : units) {
        for (float& v : unit) v = math::to_f32(math::from_f32<bf16>(v));
      }
    }
    GptOptions options;
    options.keep_logits = true;
    Gpt model(c, Allocator(), nullptr, options);
    model.begin_micro_batch(0);
    for (int u = 0; u < layout.num_units(); ++u) model.forward(u, testing::wrap(units[static_cast<size_t>(u)]));
    const std::string out = root + "/" + std::string(dtype_name(dtype));
    export_gpt_hf(out, c, [&](const std::string& name) {
      const ParamPlacement& p = layout.param(name);
      const float* begin = units[static_cast<size_t>(p.unit)].data() + p.offset;
      return std::vector<float>(begin, begin + p.numel);
    }, dtype);

    const int64_t vp = gpt_padded_vocab(c.vocab);
    Json tokens = Json::array(), logits = Json::array();
    for (int64_t b = 0; b < c.micro_batch_size; ++b) {
      Json row_tokens = Json::array(), row_logits = Json::array();
      for (int64_t t = 0; t < c.context; ++t) {
        const int64_t r = b * c.context + t;
        row_tokens.push_back(model.inputs()[r]);
        row_logits.push_back(std::vector<float>(model.logits() + r * vp, model.logits() + r * vp + c.vocab));
      }
      tokens.push_back(row_tokens);
      logits.push_back(row_logits);
    }
    const std::string expected = out + "/mp_logits.json";
    write_bytes(expected, Json{{"tokens", tokens}, {"logits", logits}}.dump());

    const std::string command = "'" + std::string(python) + "' '" + script + "' '" + out + "' '" + expected + "'";
    const int status = std::system(command.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << command << ": status " << status;
    if (WEXITSTATUS(status) == 77) GTEST_SKIP() << command << ": torch or transformers is not importable";
    EXPECT_EQ(WEXITSTATUS(status), 0) << command;
  }
}

}  // namespace
}  // namespace mp

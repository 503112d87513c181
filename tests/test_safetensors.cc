// Safetensors files (formats/safetensors.h) and the GPT-2 export/import
// (models/gpt_hf.h): exact round trips in fp32 and bf16, every kind of bad
// file named with the file and what is wrong, and (where a Python with torch
// and transformers is given) transformers computing our logits from our
// export (tests/check_hf_export.py).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/convert_math.h"
#include "models/gpt.h"
#include "models/gpt_hf.h"
#include "core/error.h"
#include "models/flat_layout.h"
#include "formats/safetensors.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

#ifndef MP_TEST_GOLDEN_DIR
#error "MP_TEST_GOLDEN_DIR (tests/golden) must be defined by the build"
#endif

namespace mp {
namespace {

using Json = nlohmann::json;
using testing::error_of;
using testing::read_bytes;
using testing::TempDirTest;
using testing::write_bytes;

uint32_t bits_of(float v) {
  uint32_t b = 0;
  std::memcpy(&b, &v, 4);
  return b;
}

float float_of(uint32_t b) {
  float v = 0;
  std::memcpy(&v, &b, 4);
  return v;
}

std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

// A file of `header` (JSON text, not padded) followed by `data`.
std::string file_bytes(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

// ---- safetensors ------------------------------------------------------------------

using Safetensors = TempDirTest;

TEST_F(Safetensors, F32RoundTripsBitwiseInTheHuggingFaceLayout) {
  const std::vector<float> specials = {0.0f, -0.0f, 1.0f, -2.5f, std::numeric_limits<float>::infinity(),
                                       -std::numeric_limits<float>::infinity(), float_of(0x7fc01234u),
                                       float_of(0x00000001u), std::numeric_limits<float>::max(), 3.14159f,
                                       1e-30f, -7.0f};
  std::vector<SafetensorsTensor> tensors = {
      make_safetensors_tensor("specials", {3, 4}, specials, DType::kF32),
      make_safetensors_tensor("b.random", {5, 7, 3}, random_values(105, 1), DType::kF32),
      make_safetensors_tensor("a.scalar", {}, {42.5f}, DType::kF32),
      make_safetensors_tensor("empty", {0, 3}, {}, DType::kF32),
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "17"}};
  const std::string p = path("f32.safetensors");
  write_safetensors(p, tensors, metadata);
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));

  const SafetensorsFile f = read_safetensors(p);
  EXPECT_EQ(f.path, p);
  EXPECT_EQ(f.metadata, metadata);
  ASSERT_EQ(f.tensors.size(), 4u);
  for (const SafetensorsTensor& t : tensors) {
    const SafetensorsEntry& e = f.tensors.at(t.name);
    EXPECT_EQ(e.dtype, "F32") << t.name;
    EXPECT_EQ(e.shape, t.shape) << t.name;
    ASSERT_EQ(e.values.size() * 4, t.bytes.size()) << t.name;
    if (!t.bytes.empty()) {  // memcmp of a null pointer is undefined even for 0 bytes
      EXPECT_EQ(std::memcmp(e.values.data(), t.bytes.data(), t.bytes.size()), 0) << t.name;
    }
  }
  EXPECT_EQ(bits_of(f.tensors.at("specials").values[6]), 0x7fc01234u);  // NaN payload kept
  EXPECT_EQ(bits_of(f.tensors.at("specials").values[1]), 0x80000000u);  // -0

  // The bytes: header length, a space-padded header of a multiple of 8 bytes,
  // then the tensors in name order, contiguous.
  const std::string bytes = read_bytes(p);
  const uint64_t n = header_length(bytes);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
  const Json j = Json::parse(header);
  EXPECT_EQ(j.at("__metadata__").at("step"), "17");
  uint64_t offset = 0;
  for (const char* name : {"a.scalar", "b.random", "empty", "specials"}) {
    const Json& t = j.at(name);
    EXPECT_EQ(t.at("dtype"), "F32");
    const auto o = t.at("data_offsets").get<std::vector<uint64_t>>();
    EXPECT_EQ(o[0], offset) << name;
    offset = o[1];
  }
  EXPECT_EQ(j.at("a.scalar").at("shape"), Json::array());
  EXPECT_EQ(bytes.size(), 8 + n + offset);
  EXPECT_EQ(bytes.substr(8 + n, 4), tensors[2].bytes);  // a.scalar first

  // Rewriting replaces the file; no temporary file stays behind.
  write_safetensors(p, {tensors[2]});
  EXPECT_EQ(read_safetensors(p).tensors.size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
}

TEST_F(Safetensors, Bf16AndF16ReadBackAsTheRoundedValues) {
  std::vector<float> values = random_values(1000, 2, 3.0f);
  values.push_back(1.00390625f);  // halfway between two bf16 values: ties to even (1.0)
  values.push_back(1e-40f);       // fp32 denormal, rounded not flushed
  values.push_back(3e38f);        // near bf16's max (fp32's range): stays finite
  values.push_back(70000.0f);     // above fp16's max: +Inf in fp16
  const Shape shape = {static_cast<int64_t>(values.size())};
  const std::string p = path("mixed.safetensors");
  // Mixed dtypes: larger elements first, so the F32 tensor stays 4-byte aligned.
  write_safetensors(p, {make_safetensors_tensor("a_bf16", shape, values, DType::kBF16),
                        make_safetensors_tensor("b_f16", shape, values, DType::kF16),
                        make_safetensors_tensor("c_f32", {3}, {1.0f, 2.0f, 3.0f}, DType::kF32)});
  const SafetensorsFile f = read_safetensors(p);
  const SafetensorsEntry& b = f.tensors.at("a_bf16");
  const SafetensorsEntry& h = f.tensors.at("b_f16");
  EXPECT_EQ(b.dtype, "BF16");
  EXPECT_EQ(h.dtype, "F16");
  EXPECT_EQ(f.tensors.at("c_f32").values, (std::vector<float>{1.0f, 2.0f, 3.0f}));
  ASSERT_EQ(b.values.size(), values.size());
  ASSERT_EQ(h.values.size(), values.size());
  size_t changed = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const float want_b = math::to_f32(math::from_f32<bf16>(values[i]));
    const float want_h = math::to_f32(math::from_f32<fp16>(values[i]));
    EXPECT_EQ(bits_of(b.values[i]), bits_of(want_b)) << "bf16 [" << i << "] of " << values[i];
    EXPECT_EQ(bits_of(h.values[i]), bits_of(want_h)) << "fp16 [" << i << "] of " << values[i];
    changed += b.values[i] != values[i] ? 1 : 0;
  }
  EXPECT_GT(changed, 900u);  // the values really were rounded
  EXPECT_EQ(b.values[1000], 1.0f);
  EXPECT_TRUE(std::isinf(h.values[1003]));
  const Json j = Json::parse(read_bytes(p).substr(8, header_length(read_bytes(p))));
  EXPECT_EQ(j.at("c_f32").at("data_offsets")[0], 0);
  EXPECT_EQ(j.at("a_bf16").at("data_offsets")[0], 12);
  EXPECT_EQ(j.at("b_f16").at("data_offsets")[0], 12 + 2 * values.size());
}

TEST_F(Safetensors, ReadOptionsLoadOnlyTheTensorsAskedFor) {
  const std::string p = path("some.safetensors");
  write_safetensors(p, {make_safetensors_tensor("keep", {2}, {1.0f, 2.0f}, DType::kF32),
                        make_safetensors_tensor("skip", {3}, {3.0f, 4.0f, 5.0f}, DType::kBF16)});
  SafetensorsReadOptions options;
  options.load = [](const std::string& name) { return name == "keep"; };
  const SafetensorsFile f = read_safetensors(p, options);
  EXPECT_EQ(f.tensors.at("keep").values, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_TRUE(f.tensors.at("skip").values.empty());
  EXPECT_EQ(f.tensors.at("skip").shape, Shape{3});
  EXPECT_EQ(f.tensors.at("skip").dtype, "BF16");
}

TEST_F(Safetensors, ReadsOtherWritersDtypes) {
  // Integer, F64 and BOOL tensors as other libraries write them.
  std::string data;
  const int64_t i64[2] = {-3, 1 << 20};
  const double f64[1] = {0.1};
  const uint8_t flags[2] = {0, 7};
  data.append(reinterpret_cast<const char*>(i64), 16);
  data.append(reinterpret_cast<const char*>(f64), 8);
  data.append(reinterpret_cast<const char*>(flags), 2);
  const std::string p = path("ints.safetensors");
  write_bytes(p, file_bytes(R"({"i":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                            R"("d":{"dtype":"F64","shape":[],"data_offsets":[16,24]},)"
                            R"("m":{"dtype":"BOOL","shape":[2],"data_offsets":[24,26]}})",
                            data));
  const SafetensorsFile f = read_safetensors(p);
  EXPECT_EQ(f.tensors.at("i").values, (std::vector<float>{-3.0f, 1048576.0f}));
  EXPECT_EQ(f.tensors.at("d").values, (std::vector<float>{0.1f}));
  EXPECT_EQ(f.tensors.at("m").values, (std::vector<float>{0.0f, 1.0f}));
  EXPECT_TRUE(f.metadata.empty());
}

// Each case edits a valid file of two tensors:
//   "a": F32 [2, 3] at [0, 24), "b": F32 [3, 2] at [24, 48), metadata {"format": "pt"}.
TEST_F(Safetensors, CorruptFilesNameTheFileTheTensorAndTheProblem) {
  const std::string good = path("good.safetensors");
  write_safetensors(good, {make_safetensors_tensor("a", {2, 3}, random_values(6, 3), DType::kF32),
                           make_safetensors_tensor("b", {3, 2}, random_values(6, 4), DType::kF32)},
                    {{"format", "pt"}});
  const std::string valid = read_bytes(good);
  const uint64_t n = header_length(valid);
  const std::string header = valid.substr(8, n);
  const std::string data = valid.substr(8 + n);
  ASSERT_EQ(data.size(), 48u);
  ASSERT_NO_THROW(read_safetensors(good));
  const auto edit = [&](const std::string& from, const std::string& to) {
    std::string h = header;
    const size_t at = h.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) h.replace(at, from.size(), to);
    return file_bytes(h, data);
  };
  const std::string a_entry = R"("a":{"data_offsets":[0,24],"dtype":"F32","shape":[2,3]})";
  ASSERT_NE(header.find(a_entry), std::string::npos) << header;
  std::string huge_length = valid;
  const uint64_t huge = 200'000'000;
  std::memcpy(huge_length.data(), &huge, 8);
  std::string past_end = valid;
  const uint64_t past = valid.size();
  std::memcpy(past_end.data(), &past, 8);

  struct Case {
    const char* name;
    std::string bytes;
    std::string expected;  // a substring of the message, after "safetensors file 'PATH': "
  };
  const std::vector<Case> cases = {
      {"empty", "", "0 bytes, shorter than the 8-byte header length"},
      {"short", valid.substr(0, 5), "5 bytes, shorter than the 8-byte header length"},
      {"huge_header_length", huge_length, "header length 200000000 bytes is above the limit of 100000000"},
      {"header_past_end", past_end, "header length " + std::to_string(past) + " bytes runs past the end of the " +
                                        std::to_string(past) + "-byte file"},
      {"json_syntax", edit("\"shape\":[2,3]}", "\"shape\":[2,3]"), "the header is not valid JSON: "},
      {"json_not_object", file_bytes("[1, 2]", data), "the header is a JSON array, not an object"},
      {"bad_utf8", edit("\"a\":", "\"a\xff\":"), "ill-formed UTF-8 byte; last read: '\"a\\xff'"},
      {"deep_nesting", edit("\"format\":\"pt\"", "\"x\":[[[[[[[[[[[[1]]]]]]]]]]]]"), "nests JSON deeper than 8"},
      {"entry_not_object", edit(a_entry, "\"a\":5"), "tensor 'a': the entry is a JSON number, not an object"},
      {"missing_dtype", edit("\"dtype\":\"F32\",\"shape\":[2,3]", "\"shape\":[2,3]"), "tensor 'a': no \"dtype\" field"},
      {"missing_offsets", edit("\"data_offsets\":[0,24],", ""), "tensor 'a': no \"data_offsets\" field"},
      {"dtype_not_string", edit("\"dtype\":\"F32\",\"shape\":[2,3]", "\"dtype\":32,\"shape\":[2,3]"),
       "tensor 'a': dtype 32 is not a string"},
      {"unknown_dtype", edit("\"F32\",\"shape\":[2,3]", "\"F31\",\"shape\":[2,3]"),
       "tensor 'a': unknown dtype \"F31\" (known: BOOL, U8"},
      {"shape_not_array", edit("[2,3]", "6"), "tensor 'a': shape 6 is not an array"},
      {"negative_dim", edit("[2,3]", "[-2,-3]"), "tensor 'a': shape dimension -2 is not a non-negative integer"},
      {"fractional_dim", edit("[2,3]", "[2.5,3]"), "tensor 'a': shape dimension 2.5 is not a non-negative integer"},
      {"dim_too_large", edit("[2,3]", "[9223372036854775808]"), "tensor 'a': shape dimension 9223372036854775808 is too large"},
      {"shape_overflow", edit("[2,3]", "[4294967296,4294967296]"),
       "tensor 'a': shape [4294967296, 4294967296] of F32 overflows a 64-bit byte count"},
      {"offsets_not_pair", edit("[0,24]", "[0]"), "tensor 'a': data_offsets [0] is not an array [begin, end]"},
      {"offset_not_integer", edit("[0,24]", "[0,1e30]"), "tensor 'a': data_offsets end 1e+30 is not a non-negative integer"},
      {"offsets_reversed", edit("[0,24]", "[24,0]"), "tensor 'a': data_offsets [24, 0] end before begin"},
      {"offsets_wrong_span", edit("[0,24]", "[0,20]"),
       "tensor 'a': data_offsets [0, 20] span 20 bytes, but F32 [2, 3] needs 24"},
      {"shape_disagrees", edit("[2,3]", "[2,4]"), "tensor 'a': data_offsets [0, 24] span 24 bytes, but F32 [2, 4] needs 32"},
      {"offsets_out_of_region", edit("[0,24]", "[48,72]"),
       "tensor 'a': data_offsets [48, 72] run past the end of the 48-byte data region"},
      {"truncated", valid.substr(0, valid.size() - 1),
       "tensor 'b': data_offsets [24, 48] run past the end of the 47-byte data region (file truncated?)"},
      {"overlap", edit("[0,24]", "[24,48]"), "data_offsets [24, 48] overlap tensor 'a' at [24, 48]"},
      {"gap", file_bytes(header.substr(0, header.find("[24,48]")) + "[32,56]" +
                             header.substr(header.find("[24,48]") + 7),
                         data + std::string(8, '\0')),
       "tensor 'b': data_offsets [32, 56] leave a gap of 8 bytes after offset 24"},
      {"trailing_bytes", valid + "junk", "4 bytes after the last tensor (the tensors end at offset 48 of the 52-byte"},
      {"duplicate_tensor", edit(a_entry, a_entry + "," + a_entry), "the header names 'a' twice (duplicate tensor)"},
      {"duplicate_field", edit("\"dtype\":\"F32\",\"shape\":[2,3]", "\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[2,3]"),
       "the header names 'dtype' twice"},
      {"metadata_not_object", edit("{\"format\":\"pt\"}", "[\"pt\"]"), "__metadata__ is a JSON array, not an object"},
      {"metadata_not_string", edit("\"pt\"", "1"), "__metadata__ value of 'format' is 1, not a string"},
  };
  for (const Case& c : cases) {
    const std::string p = path(std::string(c.name) + ".safetensors");
    write_bytes(p, c.bytes);
    const std::string message = error_of<ConfigError>([&] { read_safetensors(p); });
    const std::string prefix = "safetensors file '" + p + "': ";
    EXPECT_EQ(message.rfind(prefix, 0), 0u) << c.name << ": " << message;
    EXPECT_NE(message.find(c.expected), std::string::npos)
        << c.name << ":\n  message:  " << message << "\n  expected: " << c.expected;
  }
  EXPECT_THROW(read_safetensors(path("missing.safetensors")), IoError);
  EXPECT_THROW(read_safetensors(dir_), IoError);
}

TEST_F(Safetensors, WriterRefusesBadTensorsAndUnwritablePaths) {
  const std::string p = path("bad.safetensors");
  SafetensorsTensor t = make_safetensors_tensor("x", {2}, {1.0f, 2.0f}, DType::kF32);
  EXPECT_THROW(write_safetensors(p, {t, t}), EnforceError);
  SafetensorsTensor short_bytes = t;
  short_bytes.bytes.pop_back();
  EXPECT_THROW(write_safetensors(p, {short_bytes}), EnforceError);
  SafetensorsTensor reserved = t;
  reserved.name = "__metadata__";
  EXPECT_THROW(write_safetensors(p, {reserved}), EnforceError);
  EXPECT_FALSE(std::filesystem::exists(p));
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
  const std::string message = [&] {
    try {
      write_safetensors(path("no/such/dir/x.safetensors"), {t});
    } catch (const IoError& e) {
      return e.message();
    }
    return std::string("(no IoError)");
  }();
  EXPECT_NE(message.find("safetensors file '" + path("no/such/dir/x.safetensors.tmp") + "': cannot create"),
            std::string::npos)
      << message;
}

// ---- GPT-2 export and import ---------------------------------------------------------

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
        const uint32_t want = i < real ? bits_of(values[i]) : 0u;  // padding rows import as +0
        ASSERT_EQ(bits_of(g[i]), want) << name << "[" << i << "] from " << from;
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
      ASSERT_EQ(bits_of(got.at(name)[i]), bits_of(math::to_f32(math::from_f32<bf16>(values[i])))) << name << "[" << i << "]";
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
    Gpt model(c);
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

// Safetensors files (formats/safetensors.h): exact round trips in fp32,
// bf16 and fp16, partial reads, other writers' dtypes, and every kind of bad
// file named with the file, the tensor and what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "kernels/convert_math.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using Json = nlohmann::json;
using math::f32_bits;
using math::f32_from_bits;
using testing::error_of;
using testing::random_values;
using testing::read_bytes;
using testing::TempDirTest;
using testing::write_bytes;

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

using Safetensors = TempDirTest;

TEST_F(Safetensors, F32RoundTripsBitwiseInTheHuggingFaceLayout) {
  const std::vector<float> specials = {0.0f, -0.0f, 1.0f, -2.5f, std::numeric_limits<float>::infinity(),
                                       -std::numeric_limits<float>::infinity(), f32_from_bits(0x7fc01234u),
                                       f32_from_bits(0x00000001u), std::numeric_limits<float>::max(), 3.14159f,
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
  EXPECT_EQ(f32_bits(f.tensors.at("specials").values[6]), 0x7fc01234u);  // NaN payload kept
  EXPECT_EQ(f32_bits(f.tensors.at("specials").values[1]), 0x80000000u);  // -0

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
    EXPECT_EQ(f32_bits(b.values[i]), f32_bits(want_b)) << "bf16 [" << i << "] of " << values[i];
    EXPECT_EQ(f32_bits(h.values[i]), f32_bits(want_h)) << "fp16 [" << i << "] of " << values[i];
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

}  // namespace
}  // namespace mp

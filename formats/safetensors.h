// formats/safetensors.h: Hugging Face safetensors files, read and written
// without the safetensors library, so weights move between mp and the
// Python ecosystem (models/gpt_hf.h maps our GPT to transformers' GPT-2).
//
// Layout (https://github.com/huggingface/safetensors, little-endian):
//   uint64 N                      the header's length in bytes
//   N bytes of UTF-8 JSON         {"NAME": {"dtype": "F32", "shape": [2, 3],
//                                           "data_offsets": [BEGIN, END]}, ...,
//                                  "__metadata__": {"KEY": "VALUE", ...}}
//   the data region               each tensor's elements, row-major,
//                                 little-endian, at [BEGIN, END) counted from
//                                 the first byte after the header
// "__metadata__" is optional and maps strings to strings.
//
// Writing does what the Hugging Face library does: the header is padded
// with spaces to a multiple of 8 bytes, and the tensors are stored
// contiguously, without gaps, by decreasing element size and then by name
// (for a file of one dtype that is name order; larger elements first keeps
// every tensor aligned to its element size). The file appears atomically:
// it is written to PATH.tmp, fsynced and renamed.
//
// Reading: the file is untrusted. Every size and offset is checked before
// anything is read: a file shorter than 8 bytes, a header length past the end
// of the file or above kSafetensorsMaxHeaderBytes, a header that is not
// valid JSON or not an object of objects, a missing or ill-typed field, a
// duplicate name, an unknown dtype, a shape that overflows, data_offsets whose
// span is not numel * element size, that leave the data region, overlap
// another tensor's or leave a gap, and bytes after the last tensor (the
// Hugging Face library refuses the last three too). Each gives ConfigError
// "safetensors file 'PATH': tensor 'NAME': what is wrong"; a file that cannot
// be opened, read or written gives IoError naming it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace mp {

inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;  // the Hugging Face library's limit
inline constexpr char kSafetensorsMetadataKey[] = "__metadata__";

// The safetensors name of an mp dtype: "F32", "BF16", "F16", "F8_E4M3",
// "F8_E5M2".
std::string_view safetensors_dtype_name(DType dtype);

// One tensor to write.
struct SafetensorsTensor {
  std::string name;  // unique in the file, not empty, not "__metadata__"
  DType dtype = DType::kF32;
  Shape shape;        // [] is a scalar (one element)
  std::string bytes;  // shape_numel(shape) elements of dtype, little-endian
};

// A tensor of `values` (shape_numel(shape) of them) rounded to `dtype`
// (nearest even, kernels/convert_math.h; fp32 is copied bit for bit).
SafetensorsTensor make_safetensors_tensor(std::string name, Shape shape, const std::vector<float>& values,
                                          DType dtype);

// Writes `tensors` and `metadata` to `path` in the layout above, atomically.
// A duplicate, empty or reserved name, or bytes that do not match the shape,
// is a caller bug (EnforceError); file system errors give IoError.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// One tensor as read.
struct SafetensorsEntry {
  std::string dtype;  // the file's dtype name: "F32", "BF16", "F16", "I64", ...
  Shape shape;
  // The elements converted to fp32 (exact from F32, BF16, F16 and the fp8
  // types, integers up to 2^24 and BOOL; F64 and larger integers round to
  // nearest). Empty for a tensor the read options did not load.
  std::vector<float> values;
};

struct SafetensorsFile {
  std::string path;
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
};

struct SafetensorsReadOptions {
  // The tensors to read and convert; null: all. The others are still
  // checked and listed, with empty values.
  std::function<bool(const std::string& name)> load;
};

// The dtypes a file may hold (the Hugging Face library's set of whole-byte
// types): BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32,
// F64, I64, U64.
SafetensorsFile read_safetensors(const std::string& path, const SafetensorsReadOptions& options = {});

}  // namespace mp

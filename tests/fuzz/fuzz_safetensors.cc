// tests/fuzz/fuzz_safetensors.cc: read_safetensors (formats/safetensors.h) on
// untrusted bytes. The input is the whole file. What is accepted must be
// what the file says: every tensor's values are shape_numel(shape) long, and
// the file written back from an accepted F32/BF16/F16 file reads the same.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mp;
  const std::string path = fuzz::scratch_dir() + "/model.safetensors";
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  SafetensorsFile f;
  try {
    f = read_safetensors(path);
  } catch (const ConfigError&) {
    return 0;
  } catch (const IoError&) {
    return 0;
  }
  // Accepted: 8 bytes of header length, the header, then exactly the data.
  if (size < 8) fuzz::fail("accepted a file shorter than its header length", path);
  std::vector<SafetensorsTensor> again;
  for (const auto& [name, t] : f.tensors) {
    if (static_cast<int64_t>(t.values.size()) != shape_numel(t.shape)) {
      fuzz::fail("values and shape disagree for a tensor", path + ": " + name);
    }
    if (name.empty()) continue;  // the writer refuses empty names (a caller bug there)
    DType dtype;
    if (t.dtype == "F32") {
      dtype = DType::kF32;
    } else if (t.dtype == "BF16") {
      dtype = DType::kBF16;
    } else if (t.dtype == "F16") {
      dtype = DType::kF16;
    } else {
      continue;
    }
    again.push_back(make_safetensors_tensor(name, t.shape, t.values, dtype));
  }
  // Round trip: these dtypes hold their fp32 values exactly, so writing them
  // back and reading again gives the same bits (any NaN stays a NaN).
  const std::string back = fuzz::scratch_dir() + "/back.safetensors";
  write_safetensors(back, again);
  const SafetensorsFile g = read_safetensors(back);
  for (const SafetensorsTensor& t : again) {
    const auto it = g.tensors.find(t.name);
    if (it == g.tensors.end()) fuzz::fail("a tensor written back is missing", back + ": " + t.name);
    const std::vector<float>& a = f.tensors.at(t.name).values;
    const std::vector<float>& b = it->second.values;
    if (a.size() != b.size()) fuzz::fail("a tensor written back has another size", back + ": " + t.name);
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i]) && std::isnan(b[i])) continue;
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
        fuzz::fail("a tensor written back reads differently", back + ": " + t.name);
      }
    }
  }
  return 0;
}

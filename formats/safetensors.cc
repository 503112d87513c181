#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"
#include "kernels/convert_math.h"

namespace mp {

static_assert(std::endian::native == std::endian::little, "safetensors files are little-endian; add byte swaps");

namespace {

using Json = nlohmann::json;

// ---- dtypes -------------------------------------------------------------------

using ToF32 = void (*)(const unsigned char* src, size_t n, float* dst);

template <class T>
void elements_to_f32(const unsigned char* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * sizeof(T), sizeof(T));
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, fp16> || std::is_same_v<T, fp8_e4m3> ||
                  std::is_same_v<T, fp8_e5m2>) {
      dst[i] = math::to_f32(v);
    } else {
      dst[i] = static_cast<float>(v);
    }
  }
}

void bools_to_f32(const unsigned char* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = src[i] != 0 ? 1.0f : 0.0f;
}

struct FileDType {
  const char* name;
  size_t size;
  ToF32 to_f32;
};

// The Hugging Face library's whole-byte dtypes, in its order (by size).
constexpr FileDType kFileDTypes[] = {
    {"BOOL", 1, bools_to_f32},
    {"U8", 1, elements_to_f32<uint8_t>},
    {"I8", 1, elements_to_f32<int8_t>},
    {"F8_E5M2", 1, elements_to_f32<fp8_e5m2>},
    {"F8_E4M3", 1, elements_to_f32<fp8_e4m3>},
    {"I16", 2, elements_to_f32<int16_t>},
    {"U16", 2, elements_to_f32<uint16_t>},
    {"F16", 2, elements_to_f32<fp16>},
    {"BF16", 2, elements_to_f32<bf16>},
    {"I32", 4, elements_to_f32<int32_t>},
    {"U32", 4, elements_to_f32<uint32_t>},
    {"F32", 4, elements_to_f32<float>},
    {"F64", 8, elements_to_f32<double>},
    {"I64", 8, elements_to_f32<int64_t>},
    {"U64", 8, elements_to_f32<uint64_t>},
};

const FileDType* find_file_dtype(const std::string& name) {
  for (const FileDType& t : kFileDTypes) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

std::string file_dtype_names() {
  std::string names;
  for (const FileDType& t : kFileDTypes) names += std::string(names.empty() ? "" : ", ") + t.name;
  return names;
}

// ---- files --------------------------------------------------------------------

std::string errno_string() { return std::strerror(errno); }

// `text` with bytes outside printable ASCII written as \xNN: parser
// messages quote the bad input, which may be any bytes.
std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7f) {
      out.push_back(c);
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[b >> 4], kHex[b & 15]};
    }
  }
  return out;
}


// ---- reading the header ---------------------------------------------------------

// Parses the header, refusing duplicate keys in any object (nlohmann keeps
// the last silently) and nesting deeper than a header ever needs.
Json parse_header(const std::string& path, const std::string& text) {
  constexpr int kMaxDepth = 8;
  std::vector<std::set<std::string>> keys;  // one per open object
  const Json::parser_callback_t check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > kMaxDepth) {
      MP_THROW(ConfigError, "safetensors file '", path, "': the header nests JSON deeper than ", kMaxDepth,
               " levels");
    }
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(key).second) {
        MP_THROW(ConfigError, "safetensors file '", path, "': the header names '", key, "' twice",
                 keys.size() == 1 ? " (duplicate tensor)" : "");
      }
    }
    return true;
  };
  try {
    return Json::parse(text, check);
  } catch (const Json::exception& e) {
    MP_THROW(ConfigError, "safetensors file '", path, "': the header is not valid JSON: ", printable(e.what()));
  }
}

// An unsigned JSON integer that fits int64, or ConfigError saying `what`.
uint64_t json_u64(const Json& v, const std::string& where, const char* what) {
  if (!v.is_number_unsigned()) {
    MP_THROW(ConfigError, where, ": ", what, " ", v.dump(), " is not a non-negative integer");
  }
  const auto u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    MP_THROW(ConfigError, where, ": ", what, " ", u, " is too large");
  }
  return u;
}

struct TensorRecord {
  std::string name;
  const FileDType* dtype = nullptr;
  Shape shape;
  uint64_t begin = 0, end = 0;  // in the data region
};

TensorRecord parse_tensor(const std::string& path, const std::string& name, const Json& info,
                          uint64_t data_bytes) {
  const std::string where = "safetensors file '" + path + "': tensor '" + name + "'";
  if (!info.is_object()) MP_THROW(ConfigError, where, ": the entry is a JSON ", info.type_name(), ", not an object");
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!info.contains(field)) MP_THROW(ConfigError, where, ": no \"", field, "\" field");
  }
  TensorRecord t;
  t.name = name;
  const Json& dtype = info.at("dtype");
  if (!dtype.is_string()) MP_THROW(ConfigError, where, ": dtype ", dtype.dump(), " is not a string");
  t.dtype = find_file_dtype(dtype.get<std::string>());
  if (t.dtype == nullptr) {
    MP_THROW(ConfigError, where, ": unknown dtype ", dtype.dump(), " (known: ", file_dtype_names(), ")");
  }
  const Json& shape = info.at("shape");
  if (!shape.is_array()) MP_THROW(ConfigError, where, ": shape ", shape.dump(), " is not an array");
  uint64_t numel = 1;
  bool overflow = false;
  for (const Json& dim : shape) {
    const uint64_t d = json_u64(dim, where, "shape dimension");
    t.shape.push_back(static_cast<int64_t>(d));
    overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  }
  uint64_t span_bytes = 0;
  overflow = overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
             __builtin_mul_overflow(numel, static_cast<uint64_t>(t.dtype->size), &span_bytes);
  if (overflow) {
    MP_THROW(ConfigError, where, ": shape ", shape_string(t.shape), " of ", t.dtype->name,
             " overflows a 64-bit byte count");
  }
  const Json& offsets = info.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    MP_THROW(ConfigError, where, ": data_offsets ", offsets.dump(), " is not an array [begin, end]");
  }
  t.begin = json_u64(offsets[0], where, "data_offsets begin");
  t.end = json_u64(offsets[1], where, "data_offsets end");
  if (t.end < t.begin) MP_THROW(ConfigError, where, ": data_offsets [", t.begin, ", ", t.end, "] end before begin");
  if (t.end - t.begin != span_bytes) {
    MP_THROW(ConfigError, where, ": data_offsets [", t.begin, ", ", t.end, "] span ", t.end - t.begin,
             " bytes, but ", t.dtype->name, " ", shape_string(t.shape), " needs ", span_bytes);
  }
  if (t.end > data_bytes) {
    MP_THROW(ConfigError, where, ": data_offsets [", t.begin, ", ", t.end, "] run past the end of the ",
             data_bytes, "-byte data region (file truncated?)");
  }
  return t;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const Json& metadata) {
  const std::string where = std::string("safetensors file '") + path + "': " + kSafetensorsMetadataKey;
  if (!metadata.is_object()) {
    MP_THROW(ConfigError, where, " is a JSON ", metadata.type_name(), ", not an object of strings");
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) MP_THROW(ConfigError, where, " value of '", key, "' is ", value.dump(), ", not a string");
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

// The tensors tile the data region: no two overlap, each starts where the
// previous one (by offset) ends, and the last ends at the end of the region.
void check_tiling(const std::string& path, std::vector<const TensorRecord*> sorted, uint64_t data_bytes) {
  std::sort(sorted.begin(), sorted.end(), [](const TensorRecord* a, const TensorRecord* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  const TensorRecord* furthest = nullptr;  // the tensor reaching furthest so far
  for (const TensorRecord* t : sorted) {
    if (furthest != nullptr && t->begin < furthest->end) {
      MP_THROW(ConfigError, "safetensors file '", path, "': tensor '", t->name, "': data_offsets [", t->begin, ", ",
               t->end, "] overlap tensor '", furthest->name, "' at [", furthest->begin, ", ", furthest->end, "]");
    }
    if (furthest == nullptr || t->end >= furthest->end) furthest = t;
  }
  uint64_t next = 0;
  for (const TensorRecord* t : sorted) {
    if (t->begin > next) {
      MP_THROW(ConfigError, "safetensors file '", path, "': tensor '", t->name, "': data_offsets [", t->begin, ", ",
               t->end, "] leave a gap of ", t->begin - next, " bytes after offset ", next);
    }
    next = t->end;
  }
  if (next != data_bytes) {
    MP_THROW(ConfigError, "safetensors file '", path, "': ", data_bytes - next, " bytes after the last tensor (the ",
             "tensors end at offset ", next, " of the ", data_bytes, "-byte data region)");
  }
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E5M2: return "F8_E5M2";
  }
  MP_THROW(EnforceError, "invalid DType ", static_cast<int>(dtype));
}

SafetensorsTensor make_safetensors_tensor(std::string name, Shape shape, const std::vector<float>& values,
                                          DType dtype) {
  const int64_t numel = shape_numel(shape);
  MP_ENFORCE_EQ(static_cast<int64_t>(values.size()), numel, "values of tensor '", name, "' ", shape_string(shape));
  SafetensorsTensor t{std::move(name), dtype, std::move(shape), std::string()};
  t.bytes.resize(values.size() * dtype_size(dtype));
  dispatch_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    for (size_t i = 0; i < values.size(); ++i) {
      const T v = math::from_f32<T>(values[i]);
      std::memcpy(t.bytes.data() + i * sizeof(T), &v, sizeof(T));
    }
  });
  return t;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const SafetensorsTensor*> order;
  std::set<std::string> names;
  for (const SafetensorsTensor& t : tensors) {
    MP_ENFORCE(!t.name.empty() && t.name != kSafetensorsMetadataKey, "safetensors file '", path,
               "': invalid tensor name '", t.name, "'");
    MP_ENFORCE(names.insert(t.name).second, "safetensors file '", path, "': tensor '", t.name, "' given twice");
    MP_ENFORCE_EQ(t.bytes.size(), static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype),
                  "safetensors file '", path, "': bytes of tensor '", t.name, "' ", safetensors_dtype_name(t.dtype),
                  shape_string(t.shape));
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
    const size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });
  Json header = Json::object();
  uint64_t offset = 0;
  for (const SafetensorsTensor* t : order) {
    const uint64_t end = offset + t->bytes.size();
    header[t->name] = {{"dtype", safetensors_dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  if (!metadata.empty()) header[kSafetensorsMetadataKey] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {
    MP_THROW(ConfigError, "safetensors file '", path, "': a tensor name or metadata string is not UTF-8: ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_bytes = text.size();
  AtomicFile out(path, "safetensors file");
  out.write(&header_bytes, sizeof(header_bytes));
  out.write(text.data(), text.size());
  for (const SafetensorsTensor* t : order) out.write(t->bytes.data(), t->bytes.size());
  out.commit();
}

SafetensorsFile read_safetensors(const std::string& path, const SafetensorsReadOptions& options) {
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) MP_THROW(IoError, "safetensors file '", path, "': cannot open: ", errno_string());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) MP_THROW(IoError, "safetensors file '", path, "': cannot stat: ", errno_string());
  if (!S_ISREG(st.st_mode)) MP_THROW(IoError, "safetensors file '", path, "': not a regular file");
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    MP_THROW(ConfigError, "safetensors file '", path, "': ", file_bytes,
             " bytes, shorter than the 8-byte header length");
  }
  uint64_t header_bytes = 0;
  if (!pread_all(fd.get(), &header_bytes, 8, 0)) {
    MP_THROW(IoError, "safetensors file '", path, "': cannot read the header length: ", errno_string());
  }
  if (header_bytes > kSafetensorsMaxHeaderBytes) {
    MP_THROW(ConfigError, "safetensors file '", path, "': header length ", header_bytes, " bytes is above the limit of ",
             kSafetensorsMaxHeaderBytes, " (not a safetensors file?)");
  }
  if (header_bytes > file_bytes - 8) {
    MP_THROW(ConfigError, "safetensors file '", path, "': header length ", header_bytes,
             " bytes runs past the end of the ", file_bytes, "-byte file (truncated?)");
  }
  std::string text(header_bytes, '\0');
  if (!pread_all(fd.get(), text.data(), text.size(), 8)) {
    MP_THROW(IoError, "safetensors file '", path, "': cannot read the ", header_bytes, "-byte header: ", errno_string());
  }
  const Json header = parse_header(path, text);
  if (!header.is_object()) {
    MP_THROW(ConfigError, "safetensors file '", path, "': the header is a JSON ", header.type_name(),
             ", not an object");
  }
  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - data_start;
  SafetensorsFile file;
  file.path = path;
  std::vector<TensorRecord> records;
  for (const auto& [name, info] : header.items()) {
    if (name == kSafetensorsMetadataKey) {
      file.metadata = parse_metadata(path, info);
    } else {
      records.push_back(parse_tensor(path, name, info, data_bytes));
    }
  }
  std::vector<const TensorRecord*> pointers;
  for (const TensorRecord& t : records) pointers.push_back(&t);
  check_tiling(path, pointers, data_bytes);
  // Everything is checked: read the tensors asked for.
  std::string bytes;
  for (const TensorRecord& t : records) {
    SafetensorsEntry& entry = file.tensors[t.name];
    entry.dtype = t.dtype->name;
    entry.shape = t.shape;
    if (options.load && !options.load(t.name)) continue;
    const uint64_t span = t.end - t.begin;
    bytes.resize(span);
    if (!pread_all(fd.get(), bytes.data(), span, data_start + t.begin)) {
      MP_THROW(IoError, "safetensors file '", path, "': tensor '", t.name, "': cannot read ", span, " bytes at offset ",
               data_start + t.begin, ": ", errno_string());
    }
    entry.values.resize(span / t.dtype->size);
    t.dtype->to_f32(reinterpret_cast<const unsigned char*>(bytes.data()), entry.values.size(), entry.values.data());
  }
  return file;
}

}  // namespace mp

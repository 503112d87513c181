#include "formats/text_overrides.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/strings.h"
#include "formats/text_proto.h"

namespace mp {
namespace {

namespace pb = google::protobuf;
using FD = pb::FieldDescriptor;

std::string trim(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return std::string();
  const size_t end = s.find_last_not_of(" \t");
  return s.substr(begin, end - begin + 1);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string field_names(const pb::Descriptor& d) {
  std::string names;
  for (int i = 0; i < d.field_count(); ++i) names += (i ? ", " : "") + d.field(i)->name();
  return names;
}

// What a field holds, for "engine.seed (uint64) is not a message".
std::string type_of(const FD& f) {
  std::string t = f.is_repeated() ? "repeated " : "";
  if (f.type() == FD::TYPE_MESSAGE) return t + f.message_type()->full_name();
  if (f.type() == FD::TYPE_ENUM) return t + f.enum_type()->full_name();
  return t + f.type_name();
}

// Each parser takes the field's label ("model.gpt.layers", "model.mlp.dims[1]")
// and the value text, and throws ConfigError "label = 'text': why".
int64_t parse_signed(const std::string& label, const std::string& raw, int64_t lo, int64_t hi, const char* type) {
  const std::string text = trim(raw);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size()) {
    MP_THROW(ConfigError, label, " = '", raw, "': not an integer");
  }
  if (errno == ERANGE || v < lo || v > hi) {
    MP_THROW(ConfigError, label, " = '", raw, "': out of range for ", type, " [", lo, ", ", hi, "]");
  }
  return v;
}

uint64_t parse_unsigned(const std::string& label, const std::string& raw, uint64_t hi, const char* type) {
  const std::string text = trim(raw);
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size()) {
    MP_THROW(ConfigError, label, " = '", raw, "': not an integer");
  }
  // strtoull accepts "-1" and wraps it around.
  if (errno == ERANGE || text[0] == '-' || v > hi) {
    MP_THROW(ConfigError, label, " = '", raw, "': out of range for ", type, " [0, ", hi, "]");
  }
  return v;
}

double parse_real(const std::string& label, const std::string& raw, double max_magnitude, const char* type) {
  const std::string text = trim(raw);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) {
    MP_THROW(ConfigError, label, " = '", raw, "': not a number");
  }
  if (std::isnan(v) || (std::isinf(v) && errno != ERANGE)) {
    MP_THROW(ConfigError, label, " = '", raw, "': not a finite number");
  }
  if (std::isinf(v) || std::fabs(v) > max_magnitude) {
    MP_THROW(ConfigError, label, " = '", raw, "': out of range for ", type);
  }
  return v;
}

bool parse_bool(const std::string& label, const std::string& raw) {
  const std::string text = lower(trim(raw));
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  MP_THROW(ConfigError, label, " = '", raw, "': not a bool (true, false, 1 or 0)");
}

const pb::EnumValueDescriptor* parse_enum(const std::string& label, const std::string& raw,
                                          const pb::EnumDescriptor& e) {
  const std::string text = trim(raw);
  for (int i = 0; i < e.value_count(); ++i) {
    if (lower(e.value(i)->name()) == lower(text)) return e.value(i);
  }
  char* end = nullptr;
  errno = 0;
  const long long number = std::strtoll(text.c_str(), &end, 10);
  if (!text.empty() && end == text.c_str() + text.size() && errno == 0 &&
      number >= std::numeric_limits<int>::min() && number <= std::numeric_limits<int>::max()) {
    if (const auto* v = e.FindValueByNumber(static_cast<int>(number))) return v;
  }
  MP_THROW(ConfigError, label, " = '", raw, "': not a value of ", e.full_name(), "; valid: ", enum_value_names(e),
           " (or their numbers)");
}

// Sets (or, repeated, appends) one scalar `f` of `m` from `text`.
void set_scalar(pb::Message& m, const FD& f, const std::string& label, const std::string& text) {
  const pb::Reflection& r = *m.GetReflection();
  const bool rep = f.is_repeated();
  constexpr int64_t kI32Min = std::numeric_limits<int32_t>::min();
  constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
  constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
  constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
  switch (f.cpp_type()) {
    case FD::CPPTYPE_INT32: {
      const auto v = static_cast<int32_t>(parse_signed(label, text, kI32Min, kI32Max, "int32"));
      rep ? r.AddInt32(&m, &f, v) : r.SetInt32(&m, &f, v);
      return;
    }
    case FD::CPPTYPE_INT64: {
      const int64_t v = parse_signed(label, text, kI64Min, kI64Max, "int64");
      rep ? r.AddInt64(&m, &f, v) : r.SetInt64(&m, &f, v);
      return;
    }
    case FD::CPPTYPE_UINT32: {
      const auto v = static_cast<uint32_t>(parse_unsigned(label, text, std::numeric_limits<uint32_t>::max(), "uint32"));
      rep ? r.AddUInt32(&m, &f, v) : r.SetUInt32(&m, &f, v);
      return;
    }
    case FD::CPPTYPE_UINT64: {
      const uint64_t v = parse_unsigned(label, text, std::numeric_limits<uint64_t>::max(), "uint64");
      rep ? r.AddUInt64(&m, &f, v) : r.SetUInt64(&m, &f, v);
      return;
    }
    case FD::CPPTYPE_DOUBLE: {
      const double v = parse_real(label, text, std::numeric_limits<double>::max(), "double");
      rep ? r.AddDouble(&m, &f, v) : r.SetDouble(&m, &f, v);
      return;
    }
    case FD::CPPTYPE_FLOAT: {
      const auto v = static_cast<float>(parse_real(label, text, std::numeric_limits<float>::max(), "float"));
      rep ? r.AddFloat(&m, &f, v) : r.SetFloat(&m, &f, v);
      return;
    }
    case FD::CPPTYPE_BOOL: {
      const bool v = parse_bool(label, text);
      rep ? r.AddBool(&m, &f, v) : r.SetBool(&m, &f, v);
      return;
    }
    case FD::CPPTYPE_ENUM: {
      const pb::EnumValueDescriptor* v = parse_enum(label, text, *f.enum_type());
      rep ? r.AddEnum(&m, &f, v) : r.SetEnum(&m, &f, v);
      return;
    }
    case FD::CPPTYPE_STRING:
      if (!is_valid_utf8(text)) MP_THROW(ConfigError, label, ": the value is not valid UTF-8 (text fields are UTF-8)");
      rep ? r.AddString(&m, &f, text) : r.SetString(&m, &f, text);
      return;
    case FD::CPPTYPE_MESSAGE:
      break;
  }
  MP_THROW(EnforceError, label, ": set_scalar on a message field");
}

// The field `name` of `d`, reached by `walked` ("" at the root), or ConfigError.
const FD& find_field(const pb::Descriptor& d, const std::string& path, const std::string& name,
                     const std::string& walked, const TextOverrideNames& names) {
  const std::string full = walked.empty() ? name : walked + "." + name;
  if (name.empty()) MP_THROW(ConfigError, "override field path '", path, "': empty field name");
  const FD* f = d.FindFieldByName(name);
  if (f == nullptr) {
    MP_THROW(ConfigError, "unknown field '", full, "': ", walked.empty() ? names.root : walked, " (", d.full_name(),
             ") has ", field_names(d));
  }
  return *f;
}

// Assigns `value` to the last field `f` (named `full`) of the path, in `m`.
void assign(pb::Message& m, const FD& f, const std::string& full, const std::string& value) {
  if (f.cpp_type() == FD::CPPTYPE_MESSAGE) {
    if (f.is_repeated()) {
      MP_THROW(ConfigError, full, " (", type_of(f),
               ") is a repeated message: overrides cannot assign it (set it in a config file)");
    }
    const pb::Descriptor& sub = *f.message_type();
    MP_THROW(ConfigError, full, " (", type_of(f), ") is a message: cannot assign a whole message; assign its fields",
             sub.field_count() > 0 ? detail::str(", e.g. ", full, ".", sub.field(0)->name(), "=...") : "",
             " (fields: ", field_names(sub), ")");
  }
  if (!f.is_repeated()) return set_scalar(m, f, full, value);
  m.GetReflection()->ClearField(&m, &f);
  if (value.empty()) return;
  const std::vector<std::string> items = split(value, ',');
  for (size_t k = 0; k < items.size(); ++k) set_scalar(m, f, detail::str(full, "[", k, "]"), items[k]);
}

}  // namespace

std::string enum_value_names(const pb::EnumDescriptor& e) {
  std::string names;
  for (int i = 0; i < e.value_count(); ++i) names += (i ? ", " : "") + e.value(i)->name();
  return names;
}

void apply_text_override(pb::Message& message, const std::string& assignment, const TextOverrideNames& names) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos) {
    MP_THROW(ConfigError, "override '", assignment, "': missing '=' (write field.path=value",
             names.example.empty() ? "" : ", e.g. " + names.example, ")");
  }
  const std::string path = trim(assignment.substr(0, eq));
  if (path.empty()) MP_THROW(ConfigError, "override '", assignment, "': no field path before '='");

  // On error, `message` stays as it was.
  const std::unique_ptr<pb::Message> result(message.New());
  result->CopyFrom(message);
  pb::Message* at = result.get();
  const std::vector<std::string> parts = split(path, '.');
  std::string walked;  // the path down to `at`
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const FD& f = find_field(*at->GetDescriptor(), path, parts[i], walked, names);
    walked = walked.empty() ? parts[i] : walked + "." + parts[i];
    if (f.cpp_type() != FD::CPPTYPE_MESSAGE) {
      MP_THROW(ConfigError, "'", path, "': ", walked, " (", type_of(f), ") is not a message");
    }
    if (f.is_repeated()) {
      MP_THROW(ConfigError, "'", path, "': ", walked, " (", type_of(f),
               ") is a repeated message; overrides cannot reach into it (set it in a config file)");
    }
    at = at->GetReflection()->MutableMessage(at, &f);
  }
  const FD& last = find_field(*at->GetDescriptor(), path, parts.back(), walked, names);
  assign(*at, last, walked.empty() ? parts.back() : walked + "." + parts.back(), assignment.substr(eq + 1));
  message.GetReflection()->Swap(&message, result.get());
}

}  // namespace mp

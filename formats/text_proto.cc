#include "formats/text_proto.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <cstdint>
#include <vector>

#include "core/error.h"

namespace mp {
namespace {

namespace pb = google::protobuf;

// Collects the parser's errors as "source:line:column: message", 1-based.
class ParseErrors final : public pb::io::ErrorCollector {
 public:
  explicit ParseErrors(const std::string& source) : source_(source) {}

  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (!errors_.empty()) errors_ += "\n";
    if (line < 0) {
      errors_ += detail::str(source_, ": ", message);
    } else {
      errors_ += detail::str(source_, ":", line + 1, ":", column + 1, ": ", message);
    }
  }
  const std::string& errors() const { return errors_; }

 private:
  const std::string& source_;
  std::string errors_;
};

// Every string field of `m` must be UTF-8 (proto3 strings are; a "\xff"
// escape in the text would otherwise store a byte protobuf refuses to
// serialize). Throws ConfigError "source:line:column: field: ..." for the first
// that is not.
void check_utf8(const pb::Message& m, const pb::TextFormat::ParseInfoTree* tree, const std::string& source,
                const std::string& path) {
  const pb::Reflection& r = *m.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  r.ListFields(m, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    const int n = f->is_repeated() ? r.FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      const int index = f->is_repeated() ? i : -1;
      const std::string name = path + f->name() + (f->is_repeated() ? "[" + std::to_string(i) + "]" : "");
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
        const pb::Message& sub = f->is_repeated() ? r.GetRepeatedMessage(m, f, i) : r.GetMessage(m, f);
        check_utf8(sub, tree != nullptr ? tree->GetTreeForNested(f, index) : nullptr, source, name + ".");
      } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING && f->type() == pb::FieldDescriptor::TYPE_STRING) {
        const std::string v = f->is_repeated() ? r.GetRepeatedString(m, f, i) : r.GetString(m, f);
        if (is_valid_utf8(v)) continue;
        const pb::TextFormat::ParseLocation at =
            tree != nullptr ? tree->GetLocation(f, index) : pb::TextFormat::ParseLocation();
        MP_THROW(ConfigError, source, ":", at.line + 1, ":", at.column + 1, ": ", name,
                 ": not valid UTF-8 (text fields are UTF-8)");
      }
    }
  }
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1Fu;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0Fu;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07u;
    } else {
      return false;
    }
    if (s.size() - i <= static_cast<size_t>(n)) return false;  // the sequence runs past the end
    for (int k = 1; k <= n; ++k) {
      const auto t = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((t & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (t & 0x3Fu);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

void parse_text_proto(const std::string& text, const std::string& source, pb::Message& out) {
  ParseErrors errors(source);
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  pb::TextFormat::ParseInfoTree tree;
  parser.WriteLocationsTo(&tree);
  out.Clear();
  if (!parser.ParseFromString(text, &out)) {
    MP_THROW(ConfigError, errors.errors().empty() ? source + ": cannot parse" : errors.errors());
  }
  check_utf8(out, &tree, source, "");
}

}  // namespace mp

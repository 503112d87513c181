#include "runtime/text_proto.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "runtime/error.h"

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

}  // namespace

void parse_text_proto(const std::string& text, const std::string& source, pb::Message& out) {
  ParseErrors errors(source);
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  out.Clear();
  if (!parser.ParseFromString(text, &out)) {
    MP_THROW(ConfigError, errors.errors().empty() ? source + ": cannot parse" : errors.errors());
  }
}

}  // namespace mp

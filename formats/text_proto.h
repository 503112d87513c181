// formats/text_proto.h: protobuf text format in and out, with errors that
// name the source, line and column (TrainConfig files, embedding hosts'
// EngineConfig strings).
#pragma once

#include <google/protobuf/message.h>

#include <string>
#include <string_view>

namespace mp {

// Parses `text` into `out` (cleared first). Throws ConfigError
// "SOURCE:LINE:COLUMN: message" (1-based) for every error protobuf reports.
// A string field holding bytes that are not UTF-8 is an error too (proto3
// strings are UTF-8; protobuf's text parser takes "\xff" escapes as bytes).
void parse_text_proto(const std::string& text, const std::string& source, google::protobuf::Message& out);

// Well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points
// above U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace mp

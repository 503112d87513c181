// runtime/text_proto.h: protobuf text format in and out, with errors that
// name the source, line and column (TrainConfig files, embedding hosts'
// EngineConfig strings).
#pragma once

#include <google/protobuf/message.h>

#include <string>

namespace mp {

// Parses `text` into `out` (cleared first). Throws ConfigError
// "SOURCE:LINE:COLUMN: message" (1-based) for every error protobuf reports.
void parse_text_proto(const std::string& text, const std::string& source, google::protobuf::Message& out);

}  // namespace mp

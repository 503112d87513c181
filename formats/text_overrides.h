// formats/text_overrides.h: "field.path=value" assignments on any protobuf
// message through reflection (mp_worker's --set overrides of a TrainConfig,
// launch/train_config.h). The assignment is untrusted text: fuzzed by
// tests/fuzz/fuzz_train_config.cc.
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <string>

namespace mp {

// How errors name what they are about.
struct TextOverrideNames {
  // The message the path starts from: "unknown field 'x': ROOT (full.Name) has a, b".
  std::string root = "the message";
  // An assignment errors show as an example when '=' is missing, e.g.
  // "engine.optimizer.lr=3e-4"; empty: none.
  std::string example;
};

// Applies `assignment`, "field.path=value", to `message`. The path names
// fields from the message down by their proto names (engine.optimizer.lr);
// the value is split at the first '=' and taken by the field's type:
//   integers    base 10, the whole value (no trailing text), within the
//               field's range
//   floats      strtod syntax, finite
//   bool        true, false, 1 or 0 (case-insensitive)
//   enum        a value name, case-insensitive, or its number
//   string      the value as written, spaces included; must be UTF-8
//   repeated    a comma-separated list that replaces the field; an empty
//               value clears it. An element of a repeated string cannot
//               contain a comma.
// Spaces around numbers, bools and enum names are ignored. Walking into a
// sub-message creates it, and walking into a oneof member selects it. A whole
// message and a field inside a repeated message cannot be assigned.
// Throws ConfigError naming the full path and what is wrong (an unknown field
// lists the fields its message has; an unknown enum value lists the names);
// on error `message` is unchanged.
void apply_text_override(google::protobuf::Message& message, const std::string& assignment,
                         const TextOverrideNames& names = {});

// The value names of `e`, comma-separated: "FP32, BF16, FP16".
std::string enum_value_names(const google::protobuf::EnumDescriptor& e);

}  // namespace mp

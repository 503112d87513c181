// tests/fuzz/fuzz_train_config.cc: the TrainConfig text parser, --set
// overrides (formats/text_overrides.h) and the config checks
// (launch/train_config.h) on untrusted text. Input: the config text, then overrides, each after a NUL byte
// ("field.path=value"). Properties checked beyond "no crash":
// - a failed override leaves the config unchanged;
// - every string field of an accepted config is UTF-8;
// - to_text of an accepted config parses back to the same text;
// - resolve_train_config gives settings or a ConfigError, for 1 to 3 ranks.
#include <string>
#include <vector>

#include "core/error.h"
#include "core/strings.h"
#include "launch/train_config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mp;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> parts = split(input, '\0');
  proto::TrainConfig config;
  try {
    config = parse_train_config(parts[0], "fuzz.textproto");
  } catch (const ConfigError&) {
    return 0;
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string before = config.SerializeAsString();
    try {
      apply_override(config, parts[i]);
    } catch (const ConfigError&) {
      if (config.SerializeAsString() != before) fuzz::fail("a failed override changed the config", parts[i]);
    }
  }
  // Every string is UTF-8: the binary form parses back (proto3 refuses anything else).
  proto::TrainConfig binary;
  if (!binary.ParseFromString(config.SerializeAsString())) fuzz::fail("an accepted config does not serialize", to_text(config));
  const std::string text = to_text(config);
  proto::TrainConfig again;
  try {
    again = parse_train_config(text, "to_text");
  } catch (const ConfigError& e) {
    fuzz::fail("to_text gave text that does not parse", std::string(e.what()) + "\n" + text);
  }
  if (to_text(again) != text) fuzz::fail("to_text does not round-trip", text);
  for (int world = 1; world <= 3; ++world) {
    try {
      const TrainSettings s = resolve_train_config(config, world);
      // The resolved config is what a run directory records: it resolves again.
      (void)resolve_train_config(parse_train_config(to_text(s.config), "resolved"), world);
    } catch (const ConfigError&) {
    }
  }
  return 0;
}

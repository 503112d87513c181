// tests/run_dir_test_util.h: readers of what the run directory's writers
// (launch/metrics.h, launch/tensorboard.h) write, written apart from them:
// CRC-32C one bit at a time, a TFRecord event-file reader that checks both
// CRCs, and metrics.jsonl lines parsed back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "proto/tensorboard.pb.h"
#include "tests/test_util.h"

namespace mp::testing {

// CRC-32C one bit at a time, straight from the definition: the reference
// the table-driven crc32c() is compared with.
inline uint32_t crc32c_bitwise(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : bytes) {
    crc ^= static_cast<uint8_t>(c);
    for (int bit = 0; bit < 8; ++bit) {
      if (crc & 1u) {
        crc = (crc >> 1) ^ 0x82F63B78u;
      } else {
        crc >>= 1;
      }
    }
  }
  return ~crc;
}

// TFRecord's masking of a CRC (what masked_crc32c does).
inline uint32_t mask_bitwise(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// n_bytes bytes of `bytes` from `at`, little-endian.
inline uint64_t get_le(const std::string& bytes, size_t at, int n_bytes) {
  uint64_t v = 0;
  for (int i = 0; i < n_bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
  return v;
}

// A TFRecord reader written apart from the writer: every record's framing,
// both CRCs (bitwise reference) and Event proto are checked. `error` names
// the first problem and the record it is in; events are those before it.
struct EventFile {
  std::vector<tensorboard::Event> events;
  std::string error;
};

inline EventFile read_event_file(const std::string& path) {
  const std::string bytes = read_bytes(path);
  EventFile out;
  size_t at = 0;
  for (int record = 0; at < bytes.size(); ++record) {
    const std::string where = "record " + std::to_string(record) + " at byte " + std::to_string(at);
    if (bytes.size() - at < 12) {
      out.error = where + ": truncated header";
      return out;
    }
    const uint64_t length = get_le(bytes, at, 8);
    if (get_le(bytes, at + 8, 4) != mask_bitwise(crc32c_bitwise(bytes.substr(at, 8)))) {
      out.error = where + ": length CRC mismatch";
      return out;
    }
    if (bytes.size() - at - 12 < length + 4) {
      out.error = where + ": truncated data";
      return out;
    }
    const std::string data = bytes.substr(at + 12, length);
    if (get_le(bytes, at + 12 + length, 4) != mask_bitwise(crc32c_bitwise(data))) {
      out.error = where + ": data CRC mismatch";
      return out;
    }
    tensorboard::Event event;
    if (!event.ParseFromString(data)) {
      out.error = where + ": not an Event proto";
      return out;
    }
    out.events.push_back(std::move(event));
    at += 12 + length + 4;
  }
  return out;
}

// Every line of a JSON-lines file, parsed; throws on a line that is not JSON.
inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));  // throws on invalid JSON
  return lines;
}

}  // namespace mp::testing

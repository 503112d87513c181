#include "tests/fuzz/fuzz_util.h"

#include <google/protobuf/stubs/logging.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace mp::fuzz {

namespace {

struct Scratch {
  std::string path;
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/mp_fuzz.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) fail("mkdtemp", pattern);
    path = pattern;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// protobuf logs every refused parse (invalid UTF-8 in a string field, say)
// to stderr; the targets see the refusal itself, and the log costs half the
// executions.
[[maybe_unused]] const bool kQuietProtobuf = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

}  // namespace

const std::string& scratch_dir() {
  static const Scratch s;
  return s.path;
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) fail("cannot write", path);
}

void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz target: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace mp::fuzz

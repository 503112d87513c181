// tests/fuzz/fuzz_util.h: what the fuzz targets share. Each target defines
// LLVMFuzzerTestOneInput and catches only the errors bad input is allowed
// to give (ConfigError, IoError); anything else escaping (EnforceError: a
// broken invariant, std::bad_alloc, std::length_error, a crash or a
// sanitizer report) is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace mp::fuzz {

// A directory of this process's own, created on first use (under $TMPDIR,
// else /tmp) and removed at exit.
const std::string& scratch_dir();

// Writes `bytes` to `path`, replacing it; aborts if it cannot (the fuzz
// target's own failure, not a finding).
void write_file(const std::string& path, std::string_view bytes);

// Little-endian reads that never run past the input.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(reinterpret_cast<const char*>(data)), n_(size) {}
  size_t left() const { return n_; }
  uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return static_cast<uint8_t>(*p_++);
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(u8()) << (8 * i);
    return v;
  }
  std::string_view bytes(size_t n) {
    n = n < n_ ? n : n_;
    std::string_view v(p_, n);
    p_ += n;
    n_ -= n;
    return v;
  }
  std::string_view rest() { return bytes(n_); }

 private:
  const char* p_;
  size_t n_;
};

[[noreturn]] void fail(const char* what, const std::string& detail);

}  // namespace mp::fuzz

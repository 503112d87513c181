// formats/token_file.h: token files in llm.c's format, so datasets users
// already tokenized work as they are.
//
// Layout (little-endian): a header of 256 int32, [0] = 20240520 (magic),
// [1] = 1 (version), [2] = the token count; then that many uint16 tokens.
// Files are untrusted: every field and size is checked, and a bad file gives
// ConfigError naming the file and what is wrong (exit code 2 in mp_worker);
// a file that cannot be opened or read gives IoError.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mp {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderInts = 256;
inline constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;

class TokenFile {
 public:
  // Reads and checks `path`. vocab_size > 0: every token must be below it
  // (the error names the first one that is not and its position).
  static TokenFile read(const std::string& path, int64_t vocab_size = 0);

  const std::string& path() const { return path_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<uint16_t>& tokens() const { return tokens_; }

 private:
  std::string path_;
  std::vector<uint16_t> tokens_;
};

// Writes `tokens` to `path` in the format above, atomically (AtomicFile: a
// temporary file in the same directory, fsynced, then renamed). Throws
// IoError naming the path.
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens);

}  // namespace mp

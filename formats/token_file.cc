#include "formats/token_file.h"

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/file_io.h"

namespace mp {

static_assert(std::endian::native == std::endian::little, "token files are little-endian; add byte swaps");

TokenFile TokenFile::read(const std::string& path, int64_t vocab_size) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) MP_THROW(IoError, "token file '", path, "': cannot open: ", std::strerror(errno));
  const auto file_bytes = static_cast<int64_t>(in.tellg());
  if (file_bytes < kTokenFileHeaderBytes) {
    MP_THROW(ConfigError, "token file '", path, "': ", file_bytes, " bytes, shorter than the ",
             kTokenFileHeaderBytes, "-byte header of an llm.c token file");
  }
  in.seekg(0);
  int32_t header[kTokenFileHeaderInts];
  if (!in.read(reinterpret_cast<char*>(header), kTokenFileHeaderBytes)) {
    MP_THROW(IoError, "token file '", path, "': cannot read the header");
  }
  if (header[0] != kTokenFileMagic) {
    MP_THROW(ConfigError, "token file '", path, "': magic ", header[0], ", expected ", kTokenFileMagic,
             " (not an llm.c token file)");
  }
  if (header[1] != kTokenFileVersion) {
    MP_THROW(ConfigError, "token file '", path, "': version ", header[1], ", expected ", kTokenFileVersion,
             " (uint16 tokens)");
  }
  const int64_t count = header[2];
  if (count < 0) MP_THROW(ConfigError, "token file '", path, "': negative token count ", count);
  const int64_t expected_bytes = kTokenFileHeaderBytes + 2 * count;
  if (file_bytes != expected_bytes) {
    MP_THROW(ConfigError, "token file '", path, "': the header says ", count, " tokens (", expected_bytes,
             " bytes in all) but the file has ", file_bytes, " bytes",
             file_bytes < expected_bytes ? " (truncated)" : " (trailing bytes)");
  }
  TokenFile f;
  f.path_ = path;
  f.tokens_.resize(static_cast<size_t>(count));
  if (count > 0 && !in.read(reinterpret_cast<char*>(f.tokens_.data()), 2 * count)) {
    MP_THROW(IoError, "token file '", path, "': cannot read ", count, " tokens");
  }
  if (vocab_size > 0) {
    for (size_t i = 0; i < f.tokens_.size(); ++i) {
      if (f.tokens_[i] >= vocab_size) {
        MP_THROW(ConfigError, "token file '", path, "': token ", f.tokens_[i], " at position ", i,
                 " is not below the vocabulary size ", vocab_size);
      }
    }
  }
  return f;
}

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    MP_THROW(ConfigError, "token file '", path, "': ", tokens.size(), " tokens do not fit the int32 count");
  }
  int32_t header[kTokenFileHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  AtomicFile out(path, "token file");
  out.write(header, kTokenFileHeaderBytes);
  out.write(tokens.data(), 2 * tokens.size());
  out.commit();
}

}  // namespace mp

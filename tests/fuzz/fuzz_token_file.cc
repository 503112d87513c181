// tests/fuzz/fuzz_token_file.cc: TokenFile::read (formats/token_file.h) on
// untrusted bytes. The input is the whole file; it is read twice, without
// a vocabulary and with GPT-2's (50257), and what is read must be what the
// file holds.
#include <cstring>
#include <vector>

#include "core/error.h"
#include "formats/token_file.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mp;
  const std::string path = fuzz::scratch_dir() + "/tokens.bin";
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  for (const int64_t vocab : {int64_t{0}, int64_t{50257}}) {
    try {
      const TokenFile f = TokenFile::read(path, vocab);
      // Accepted: the header's count matches the size and the tokens are the bytes after it.
      if (static_cast<size_t>(kTokenFileHeaderBytes) + 2 * static_cast<size_t>(f.size()) != size) {
        fuzz::fail("accepted a file whose size disagrees with its count", path);
      }
      if (f.size() > 0 && std::memcmp(f.tokens().data(), data + kTokenFileHeaderBytes, 2 * f.tokens().size()) != 0) {
        fuzz::fail("tokens differ from the file's bytes", path);
      }
      for (const uint16_t t : f.tokens()) {
        if (vocab > 0 && t >= vocab) fuzz::fail("accepted a token outside the vocabulary", path);
      }
    } catch (const ConfigError&) {
    } catch (const IoError&) {
    }
  }
  return 0;
}

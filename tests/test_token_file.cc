// llm.c token files (formats/token_file.h): round trip, and every kind of
// bad file gives the error that names it.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/token_file.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::error_of;

class TokenFileTest : public testing::TempDirTest {
 protected:
  // Writes raw bytes: a header with the given fields, then `tokens`.
  std::string raw(const std::string& name, int32_t magic, int32_t version, int32_t count,
                  const std::vector<uint16_t>& tokens, size_t drop_bytes = 0) {
    std::vector<int32_t> header(kTokenFileHeaderInts, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
    bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
    bytes.resize(bytes.size() - drop_bytes);
    const std::string p = path(name);
    testing::write_bytes(p, bytes);
    return p;
  }
};

TEST_F(TokenFileTest, RoundTripsAndMatchesTheLlmcLayout) {
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 1000; ++i) tokens.push_back(static_cast<uint16_t>((i * 7919) % 50257));
  const std::string ok = path("ok.bin");
  write_token_file(ok, tokens);
  const TokenFile f = TokenFile::read(ok, 50257);
  EXPECT_EQ(f.tokens(), tokens);
  EXPECT_EQ(f.size(), 1000);
  // The bytes are exactly llm.c's: the header fields, then uint16 tokens.
  std::ifstream in(ok, std::ios::binary);
  std::vector<int32_t> header(3);
  in.read(reinterpret_cast<char*>(header.data()), 12);
  EXPECT_EQ(header, (std::vector<int32_t>{20240520, 1, 1000}));
  in.seekg(1024 + 2 * 5);
  uint16_t t5 = 0;
  in.read(reinterpret_cast<char*>(&t5), 2);
  EXPECT_EQ(t5, tokens[5]);
  write_token_file(path("empty.bin"), {});
  EXPECT_EQ(TokenFile::read(dir_ + "/empty.bin").size(), 0);
}

TEST_F(TokenFileTest, BadFilesAreNamedWithWhatIsWrong) {
  const std::vector<uint16_t> t = {1, 2, 3};
  const std::string magic = raw("magic.bin", 12345, 1, 3, t);
  EXPECT_EQ(error_of([&] { TokenFile::read(magic); }),
            "token file '" + magic + "': magic 12345, expected 20240520 (not an llm.c token file)");
  const std::string version = raw("version.bin", kTokenFileMagic, 2, 3, t);
  EXPECT_EQ(error_of([&] { TokenFile::read(version); }),
            "token file '" + version + "': version 2, expected 1 (uint16 tokens)");
  const std::string truncated = raw("truncated.bin", kTokenFileMagic, 1, 3, t, 1);
  EXPECT_EQ(error_of([&] { TokenFile::read(truncated); }),
            "token file '" + truncated + "': the header says 3 tokens (1030 bytes in all) but the file has 1029 "
            "bytes (truncated)");
  const std::string trailing = raw("trailing.bin", kTokenFileMagic, 1, 2, t);
  EXPECT_EQ(error_of([&] { TokenFile::read(trailing); }),
            "token file '" + trailing + "': the header says 2 tokens (1028 bytes in all) but the file has 1030 "
            "bytes (trailing bytes)");
  const std::string negative = raw("negative.bin", kTokenFileMagic, 1, -5, t);
  EXPECT_EQ(error_of([&] { TokenFile::read(negative); }), "token file '" + negative + "': negative token count -5");
  const std::string huge = raw("huge.bin", kTokenFileMagic, 1, INT32_MAX, t);
  EXPECT_NE(error_of([&] { TokenFile::read(huge); }).find("(truncated)"), std::string::npos);
  const std::string short_file = path("short.bin");
  std::ofstream(short_file, std::ios::binary) << "tiny";
  EXPECT_EQ(error_of([&] { TokenFile::read(short_file); }),
            "token file '" + short_file + "': 4 bytes, shorter than the 1024-byte header of an llm.c token file");
  const std::string vocab = raw("vocab.bin", kTokenFileMagic, 1, 3, {1, 300, 2});
  EXPECT_EQ(error_of([&] { TokenFile::read(vocab, 256); }),
            "token file '" + vocab + "': token 300 at position 1 is not below the vocabulary size 256");
  EXPECT_NO_THROW(TokenFile::read(vocab, 301));
  EXPECT_THROW(TokenFile::read(dir_ + "/missing.bin"), IoError);
  EXPECT_THROW(TokenFile::read(magic), ConfigError);
}

}  // namespace
}  // namespace mp

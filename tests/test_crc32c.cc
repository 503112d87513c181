// CRC-32C (core/crc32c.h) against published check values and a bitwise
// reference, at every split point; the TensorFlow mask of launch/tensorboard.h
// against TensorBoard's own values.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "core/crc32c.h"
#include "launch/tensorboard.h"
#include "tests/run_dir_test_util.h"

namespace mp {
namespace {

using testing::crc32c_bitwise;

TEST(Crc32c, PublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, of ones, incrementing, decrementing.
  std::string zeros(32, '\0'), ones(32, '\xFF'), up(32, '\0'), down(32, '\0');
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<char>(i);
    down[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down), 0x113FDB5Cu);
}

TEST(Crc32c, TableMatchesBitwiseReference) {
  std::mt19937 rng(7);
  for (const size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{255}, size_t{256},
                         size_t{1000}, size_t{4099}, size_t{24575}, size_t{24576}, size_t{24583},
                         size_t{3 * 24576 + 5}, size_t{200001}}) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xFF);
    EXPECT_EQ(crc32c(bytes), crc32c_bitwise(bytes)) << "length " << n << ", hardware " << crc32c_hardware();
    // Any split point: extending a finished CRC equals the CRC of the whole.
    const size_t cut = n / 3;
    EXPECT_EQ(crc32c_extend(crc32c(bytes.substr(0, cut)), bytes.data() + cut, n - cut), crc32c(bytes)) << n;
  }
}

TEST(Crc32c, MaskedMatchesTensorFlow) {
  // Values from TensorBoard's own Python masked_crc32c.
  EXPECT_EQ(masked_crc32c("123456789"), 0xC78AB0E5u);
  EXPECT_EQ(masked_crc32c(""), 0xA282EAD8u);
  EXPECT_NE(masked_crc32c("abc"), crc32c("abc"));
}

}  // namespace
}  // namespace mp

// Philox4x32-10 against the known-answer vectors of the Random123 library.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/philox_math.h"

namespace mp {
namespace {

struct Kat {
  uint32_t ctr[4];
  uint32_t key[2];
  uint32_t expected[4];
};

TEST(Philox, MatchesRandom123KnownAnswers) {
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& k : kats) {
    const math::U32x4 r =
        math::philox4x32_10(math::U32x4{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.expected[i]) << "word " << i;
  }
}

TEST(Philox, U32PicksWordsOfOneBlock) {
  const math::U32x4 block = math::philox4x32_10(math::U32x4{{5, 0, 7, 0}}, 11, 0);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(math::philox_u32(11, 7, 20 + i), block.v[i]);
}

TEST(Philox, WordsAreUniform) {
  // Mean of 2^20 words / 2^32 is 0.5 within 5 sigma (sigma = 1/sqrt(12 n)).
  constexpr int n = 1 << 20;
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += math::philox_u32(3, 0, static_cast<uint64_t>(i)) * 0x1p-32;
  EXPECT_NEAR(sum / n, 0.5, 5 / std::sqrt(12.0 * n));
}

}  // namespace
}  // namespace mp

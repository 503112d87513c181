// Blockwise int8 quantization (kernels/cpu/quant.h, Note [Int8 blocks])
// against a float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/quant.h"

namespace mp {
namespace {

constexpr int64_t B = math::kQuantBlock;

TEST(Int8Blocks, CodesScalesAndResidualsMatchAFloat64Reference) {
  const int64_t n = 8 * B;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = normal(rng) * std::ldexp(1.0f, static_cast<int>(i / B) * 7 - 20);
  for (int64_t i = 2 * B; i < 3 * B; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero block
  std::vector<char> q(int8_span_bytes(n));
  std::vector<float> residual(static_cast<size_t>(n)), back(static_cast<size_t>(n));
  quantize_int8(x.data(), n, q.data(), residual.data());
  dequantize_int8(q.data(), n, back.data(), false);
  for (int64_t b = 0; b < n / B; ++b) {
    double absmax = 0;
    for (int64_t j = 0; j < B; ++j) absmax = std::max(absmax, std::fabs(static_cast<double>(x[static_cast<size_t>(b * B + j)])));
    float scale;
    std::memcpy(&scale, q.data() + n + b * 4, 4);
    EXPECT_EQ(scale, static_cast<float>(static_cast<float>(absmax) / 127.0f)) << "block " << b;
    for (int64_t j = 0; j < B; ++j) {
      const size_t i = static_cast<size_t>(b * B + j);
      const int code = static_cast<int8_t>(q[i]);
      const double want = scale == 0 ? 0 : std::nearbyint(static_cast<double>(x[i]) / static_cast<double>(scale));
      // x / scale in fp32 can round across a .5 tie where the fp64 quotient does not: then one off.
      EXPECT_LE(std::fabs(code - want), scale == 0 ? 0.0 : 1.0) << i;
      EXPECT_LE(std::fabs(static_cast<double>(back[i]) - x[i]), 0.5 * scale * (1 + 1e-6) + 1e-45) << i;
      EXPECT_EQ(residual[i], x[i] - back[i]) << i;
    }
  }
}

TEST(Int8Blocks, ANonFiniteValuePoisonsItsBlockOnly) {
  std::vector<float> x(static_cast<size_t>(3 * B), 0.5f);
  x[static_cast<size_t>(B + 7)] = INFINITY;
  std::vector<char> q(int8_span_bytes(3 * B));
  std::vector<float> back(x.size(), 1.0f);
  quantize_int8(x.data(), 3 * B, q.data());
  dequantize_int8(q.data(), 3 * B, back.data(), true);  // accumulate onto 1.0
  for (int64_t i = 0; i < 3 * B; ++i) {
    if (i / B == 1) {
      EXPECT_TRUE(std::isnan(back[static_cast<size_t>(i)])) << i;
    } else {
      EXPECT_EQ(back[static_cast<size_t>(i)], 1.5f) << i;
    }
  }
}

TEST(Int8Blocks, RejectsAPartialBlock) { EXPECT_THROW(quantize_int8(nullptr, B + 1, nullptr), EnforceError); }

}  // namespace
}  // namespace mp

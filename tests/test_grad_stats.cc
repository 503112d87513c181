// The fused gradient statistics pass: sum of squares against a float64
// reference, and NaN/Inf found wherever they are.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/convert_math.h"
#include "kernels/cpu/grad_stats.h"

namespace mp {
namespace {

TEST(GradStats, SumOfSquaresMatchesFloat64) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t n : {0, 1, 3, 4, 1001, 100003}) {
    std::vector<float> g(n);
    std::vector<uint16_t> b(n);
    for (int64_t i = 0; i < n; ++i) {
      g[i] = normal(rng);
      b[i] = math::f32_to_bf16_bits(g[i]);
    }
    double ref32 = 0, ref16 = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double x = static_cast<double>(g[i] * 0.25f);
      ref32 += x * x;
      const double y = static_cast<double>(math::bf16_bits_to_f32(b[i]) * 0.25f);
      ref16 += y * y;
    }
    const GradStats s32 = grad_stats_cpu(g.data(), DType::kF32, n, 0.25f);
    const GradStats s16 = grad_stats_cpu(b.data(), DType::kBF16, n, 0.25f);
    EXPECT_NEAR(s32.sum_sq, ref32, 1e-12 * (ref32 + 1)) << n;
    EXPECT_NEAR(s16.sum_sq, ref16, 1e-12 * (ref16 + 1)) << n;
    EXPECT_FALSE(s32.non_finite);
    EXPECT_FALSE(s16.non_finite);
  }
}

TEST(GradStats, FindsNaNAndInfAnywhere) {
  const int64_t n = 1003;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (int64_t at : {int64_t{0}, int64_t{1}, int64_t{500}, n - 1}) {
      std::vector<float> g(n, 1.0f);
      g[at] = bad;
      EXPECT_TRUE(grad_stats_cpu(g.data(), DType::kF32, n, 1.0f).non_finite) << bad << " at " << at;
      std::vector<uint16_t> h(n, math::f32_to_fp16_bits(1.0f));
      h[at] = math::f32_to_fp16_bits(bad);
      EXPECT_TRUE(grad_stats_cpu(h.data(), DType::kF16, n, 1.0f).non_finite) << bad << " at " << at;
    }
  }
  // A finite gradient that overflows only once scaled is non-finite too.
  std::vector<float> big(10, 3e38f);
  EXPECT_TRUE(grad_stats_cpu(big.data(), DType::kF32, 10, 2.0f).non_finite);
}

}  // namespace
}  // namespace mp

// Stochastic rounding fp32 -> bf16 / fp16: exact decision probabilities,
// unbiasedness, determinism, identity on representable values.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/convert.h"
#include "kernels/convert_math.h"
#include "kernels/philox_math.h"
#include "tests/reference_float.h"

namespace mp {
namespace {

using math::f32_bits;
using math::f32_from_bits;

TEST(StochasticRounding, Bf16RoundsUpWithProbabilityExactlyLow16Over2to16) {
  // x = 1 + k * 2^-23: the low 16 bits are k, so P(up) must be k / 2^16,
  // i.e. the decision flips exactly at rand & 0xffff == 2^16 - k.
  for (uint32_t k : {1u, 0x1234u, 0x8000u, 0xffffu}) {
    const float x = f32_from_bits(0x3f800000u + k);
    const uint32_t threshold = 0x10000u - k;  // smallest rand (low 16 bits) that rounds up
    EXPECT_EQ(math::f32_to_bf16_bits_stochastic(x, threshold - 1), 0x3f80) << k;
    EXPECT_EQ(math::f32_to_bf16_bits_stochastic(x, threshold), 0x3f81) << k;
  }
}

TEST(StochasticRounding, Fp16DecisionBoundaryIsExact) {
  // A normal fp16 drops 13 bits: P(up) = rem / 2^13, i.e. up iff rand < rem << 19.
  for (uint32_t rem : {1u, 0x555u, 0x1000u, 0x1fffu}) {
    const float x = f32_from_bits(0x3f800000u + rem);  // 1 + rem * 2^-23
    const uint32_t frac = rem << 19;
    EXPECT_EQ(math::f32_to_fp16_bits_stochastic(x, frac - 1), 0x3c01) << rem;
    EXPECT_EQ(math::f32_to_fp16_bits_stochastic(x, frac), 0x3c00) << rem;
  }
  // Deep in the fp16 denormals: 2^-30 is 2^-6 of the smallest denormal.
  const float tiny = std::ldexp(1.0f, -30);
  EXPECT_EQ(math::f32_to_fp16_bits_stochastic(tiny, (1u << 26) - 1), 0x0001);
  EXPECT_EQ(math::f32_to_fp16_bits_stochastic(tiny, 1u << 26), 0x0000);
}

TEST(StochasticRounding, RepresentableValuesAreReturnedUnchanged) {
  std::mt19937 rng(7);
  for (uint32_t b = 0; b < 65536; ++b) {
    const float bf = math::bf16_bits_to_f32(static_cast<uint16_t>(b));
    const float hf = math::fp16_bits_to_f32(static_cast<uint16_t>(b));
    for (uint32_t r : {0u, 0xffffffffu, static_cast<uint32_t>(rng())}) {
      ASSERT_EQ(math::f32_to_bf16_bits_stochastic(bf, r), math::f32_to_bf16_bits(bf)) << std::hex << b;
      ASSERT_EQ(math::f32_to_fp16_bits_stochastic(hf, r), math::f32_to_fp16_bits(hf)) << std::hex << b;
    }
  }
}

// Mean of n stochastic roundings of x (random words from Philox) versus x.
template <class Narrow, class Widen>
void expect_unbiased(float x, Narrow narrow, Widen widen, const testing::RefRounder& ref, const char* what) {
  constexpr int kSamples = 200'000;
  const auto [lo, hi] = ref.neighbours(std::fabs(static_cast<double>(x)));
  double sum = 0;
  for (int i = 0; i < kSamples; ++i) {
    const double y = widen(narrow(x, math::philox_u32(42, 3, static_cast<uint64_t>(i))));
    ASSERT_TRUE(std::fabs(y) == lo || std::fabs(y) == hi)
        << what << ": " << x << " rounded to " << y << ", not a neighbour (" << lo << ", " << hi << ")";
    sum += y;
  }
  const double mean = sum / kSamples;
  const double gap = hi - lo;
  const double p = gap > 0 ? (std::fabs(x) - lo) / gap : 0;
  const double sigma = gap * std::sqrt(p * (1 - p) / kSamples);
  EXPECT_NEAR(mean, x, 5 * sigma + 1e-12 * std::fabs(x)) << what << " at " << x << " (p = " << p << ")";
}

TEST(StochasticRounding, MeanOfManyRoundingsIsTheValue) {
  const testing::RefRounder bf16_ref(testing::kRefBF16), fp16_ref(testing::kRefFP16);
  auto bf16_narrow = [](float v, uint32_t r) { return math::f32_to_bf16_bits_stochastic(v, r); };
  auto bf16_widen = [](uint16_t b) { return static_cast<double>(math::bf16_bits_to_f32(b)); };
  auto fp16_narrow = [](float v, uint32_t r) { return math::f32_to_fp16_bits_stochastic(v, r); };
  auto fp16_widen = [](uint16_t b) { return static_cast<double>(math::fp16_bits_to_f32(b)); };
  for (float x : {1.0f + 0x1p-10f, 3.14159265f, -2.71828183f, 1e-3f, -1e30f, 1e-39f}) {
    expect_unbiased(x, bf16_narrow, bf16_widen, bf16_ref, "bf16");
  }
  for (float x : {1.0f + 0x1p-13f, 3.14159265f, -2.71828183f, 1e-3f, 3e-6f /* denormal */, -60000.5f}) {
    expect_unbiased(x, fp16_narrow, fp16_widen, fp16_ref, "fp16");
  }
}

TEST(StochasticRounding, ConvertIsDeterministicPerSeedAndIndependentOfSharding) {
  constexpr int64_t n = 4096;
  std::vector<float> src(n);
  std::mt19937 rng(1);
  for (auto& v : src) v = std::uniform_real_distribution<float>(-4, 4)(rng);
  const Tensor s = Tensor::wrap(src.data(), Device::cpu(), DType::kF32, {n});
  auto run = [&](uint64_t seed, int64_t offset, int64_t count) {
    std::vector<bf16> out(static_cast<size_t>(count));
    ConvertOptions o;
    o.rounding = Rounding::kStochastic;
    o.seed = seed;
    o.step = 9;
    o.index_offset = static_cast<uint64_t>(offset);
    convert(s.flat(offset, count), Tensor::wrap(out.data(), Device::cpu(), DType::kBF16, {count}), o);
    return out;
  };
  const auto a = run(1, 0, n), b = run(1, 0, n), c = run(2, 0, n);
  int differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a[i].bits, b[i].bits) << i;
    differ += a[i].bits != c[i].bits;
  }
  EXPECT_GT(differ, n / 4) << "a different seed should change many roundings";
  // Two halves converted separately with their global offsets equal the whole.
  const auto lo = run(1, 0, 1000), hi = run(1, 1000, n - 1000);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i].bits, (i < 1000 ? lo[i] : hi[i - 1000]).bits) << i;
}

TEST(StochasticRounding, ConvertRejectsFp8Destination) {
  float x = 1.0f;
  fp8_e4m3 y{};
  ConvertOptions o;
  o.rounding = Rounding::kStochastic;
  EXPECT_THROW(convert(Tensor::wrap(&x, Device::cpu(), DType::kF32, {1}),
                       Tensor::wrap(&y, Device::cpu(), DType::kF8E4M3, {1}), o),
               ConfigError);
}

}  // namespace
}  // namespace mp

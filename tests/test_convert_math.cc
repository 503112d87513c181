// Conversions fp32 <-> bf16 / fp16 / fp8 against the float64 reference:
// exhaustive round trips, named edge cases, and 10^7 random values per format.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "kernels/convert.h"
#include "kernels/convert_math.h"
#include "tests/reference_float.h"

namespace mp {
namespace {

using math::f32_bits;
using math::f32_from_bits;
using testing::RefFormat;
using testing::RefRounder;

struct FormatUnderTest {
  const char* name;
  RefFormat ref;
  std::function<uint32_t(float)> narrow;
  std::function<float(uint32_t)> widen;
};

std::vector<FormatUnderTest> formats() {
  return {
      {"bf16", testing::kRefBF16, [](float f) { return uint32_t{math::f32_to_bf16_bits(f)}; },
       [](uint32_t b) { return math::bf16_bits_to_f32(static_cast<uint16_t>(b)); }},
      {"fp16", testing::kRefFP16, [](float f) { return uint32_t{math::f32_to_fp16_bits(f)}; },
       [](uint32_t b) { return math::fp16_bits_to_f32(static_cast<uint16_t>(b)); }},
      {"fp8_e4m3", testing::kRefE4M3, [](float f) { return uint32_t{math::f32_to_e4m3_bits(f)}; },
       [](uint32_t b) { return math::e4m3_bits_to_f32(static_cast<uint8_t>(b)); }},
      {"fp8_e5m2", testing::kRefE5M2, [](float f) { return uint32_t{math::f32_to_e5m2_bits(f)}; },
       [](uint32_t b) { return math::e5m2_bits_to_f32(static_cast<uint8_t>(b)); }},
  };
}

// Checks one input against the reference; returns false (and records a
// failure naming the input) on mismatch.
bool check_one(const FormatUnderTest& f, const RefRounder& ref, float x) {
  const uint32_t got = f.narrow(x);
  const double got_value = testing::ref_decode(got, f.ref);
  if (std::isnan(x)) {
    if (!std::isnan(got_value)) {
      ADD_FAILURE() << f.name << ": NaN input 0x" << std::hex << f32_bits(x) << " gave non-NaN 0x" << got;
      return false;
    }
    const uint32_t sign_in = f32_bits(x) >> 31, sign_out = got >> (ref_bits(f.ref) - 1);
    if (sign_in != sign_out) {
      ADD_FAILURE() << f.name << ": NaN 0x" << std::hex << f32_bits(x) << " lost its sign";
      return false;
    }
    return true;
  }
  const uint32_t want = ref.round(static_cast<double>(x));
  if (got != want) {
    ADD_FAILURE() << f.name << ": input " << x << " (0x" << std::hex << f32_bits(x) << ") gave 0x"
                  << got << ", reference 0x" << want;
    return false;
  }
  return true;
}

TEST(ConvertMath, EveryPatternRoundTripsUnchanged) {
  for (const auto& f : formats()) {
    const uint32_t patterns = 1u << testing::ref_bits(f.ref);
    int failures = 0;
    for (uint32_t b = 0; b < patterns && failures < 10; ++b) {
      const float wide = f.widen(b);
      const double ref = testing::ref_decode(b, f.ref);
      if (std::isnan(ref)) {
        if (!std::isnan(wide)) ++failures, ADD_FAILURE() << f.name << " NaN 0x" << std::hex << b << " widened to non-NaN";
      } else if (static_cast<double>(wide) != ref || std::signbit(wide) != std::signbit(ref)) {
        ++failures, ADD_FAILURE() << f.name << " 0x" << std::hex << b << " widened to " << wide << ", reference " << ref;
      }
      const uint32_t back = f.narrow(wide);
      if (back != b) ++failures, ADD_FAILURE() << f.name << " 0x" << std::hex << b << " -> fp32 -> 0x" << back;
    }
    EXPECT_EQ(failures, 0) << f.name;
  }
}

struct Edge {
  const char* format;
  uint32_t input_bits;
  uint32_t expected;
  const char* why;
};

TEST(ConvertMath, NamedEdgeCases) {
  const Edge edges[] = {
      {"bf16", 0x3f808000, 0x3f80, "tie 1 + 2^-8 rounds to even (down)"},
      {"bf16", 0x3f818000, 0x3f82, "tie 1 + 3*2^-8 rounds to even (up)"},
      {"bf16", 0x3f808001, 0x3f81, "just above a tie rounds up"},
      {"bf16", 0x7f7f0000, 0x7f7f, "max finite bf16 is exact"},
      {"bf16", 0x7f7f7fff, 0x7f7f, "just below max + ulp/2 stays finite"},
      {"bf16", 0x7f7f8000, 0x7f80, "max + ulp/2 (tie, odd max) overflows to Inf"},
      {"bf16", 0x7f7fffff, 0x7f80, "fp32 max overflows to Inf"},
      {"bf16", 0xff800000, 0xff80, "-Inf"},
      {"bf16", 0x00000001, 0x0000, "smallest fp32 denormal rounds to +0"},
      {"bf16", 0x00008000, 0x0000, "denormal tie rounds to even 0"},
      {"bf16", 0x00018000, 0x0002, "denormal tie rounds to even 2"},
      {"bf16", 0x80008001, 0x8001, "negative denormal rounds up in magnitude"},
      {"bf16", 0x007fffff, 0x0080, "largest denormal rounds to smallest normal"},
      {"bf16", 0x7fc00001, 0x7fc0, "quiet NaN keeps top payload"},
      {"bf16", 0xffa00000, 0xffa0, "signalling NaN keeps sign and payload"},
      {"bf16", 0x7f800001, 0x7fc0, "NaN with low payload only stays NaN (quiet bit set)"},
      {"fp16", 0x477fe000, 0x7bff, "65504 is max finite"},
      {"fp16", 0x477fefff, 0x7bff, "just below 65520 stays finite"},
      {"fp16", 0x477ff000, 0x7c00, "65520 (tie, odd max) overflows to Inf"},
      {"fp16", 0x33800000, 0x0001, "2^-24 is the smallest denormal"},
      {"fp16", 0x33000000, 0x0000, "2^-25 ties to even 0"},
      {"fp16", 0x33400000, 0x0001, "1.5 * 2^-25 rounds up to 2^-24"},
      {"fp16", 0x38800000, 0x0400, "2^-14 is the smallest normal"},
      {"fp16", 0x387fe000, 0x0400, "largest denormal + half a denormal ulp ties to the smallest normal"},
      {"fp16", 0x80000000, 0x8000, "-0 keeps its sign"},
      {"fp16", 0x7f800001, 0x7e00, "NaN with low payload only stays NaN"},
      {"fp8_e4m3", 0x43e00000, 0x7e, "448 is max finite"},
      {"fp8_e4m3", 0x43e80000, 0x7e, "464 (tie with the NaN slot) stays 448"},
      {"fp8_e4m3", 0x4e6e6b28, 0x7e, "1e9 saturates"},
      {"fp8_e4m3", 0x7f800000, 0x7e, "+Inf saturates (no Inf in e4m3)"},
      {"fp8_e4m3", 0xff800000, 0xfe, "-Inf saturates"},
      {"fp8_e4m3", 0x7fc00000, 0x7f, "NaN"},
      {"fp8_e4m3", 0x3b000000, 0x01, "2^-9 is the smallest denormal"},
      {"fp8_e4m3", 0x3a800000, 0x00, "2^-10 ties to even 0"},
      {"fp8_e5m2", 0x47600000, 0x7b, "57344 is max finite"},
      {"fp8_e5m2", 0x47700000, 0x7c, "61440 (tie, odd max) overflows to Inf"},
      {"fp8_e5m2", 0x37800000, 0x01, "2^-16 is the smallest denormal"},
      {"fp8_e5m2", 0xffc00000, 0xfe, "negative quiet NaN"},
  };
  const auto fs = formats();
  for (const auto& e : edges) {
    const auto& f = *std::find_if(fs.begin(), fs.end(), [&](const auto& x) { return std::string(x.name) == e.format; });
    const float x = f32_from_bits(e.input_bits);
    EXPECT_EQ(f.narrow(x), e.expected)
        << e.format << " input 0x" << std::hex << e.input_bits << ": " << e.why;
    if (!std::isnan(x)) {
      EXPECT_EQ(RefRounder(f.ref).round(x), e.expected) << "the reference disagrees: " << e.why;
    }
  }
}

TEST(ConvertMath, TenMillionRandomValuesMatchReference) {
  constexpr int kValues = 10'000'000;
  for (const auto& f : formats()) {
    const RefRounder ref(f.ref);
    const auto& table = ref.table();
    std::mt19937_64 rng(0x5eed + f.ref.man_bits);
    // Exponents from below the smallest denormal to above the largest finite.
    const int min_exp = static_cast<int>(std::floor(std::log2(table[1].first))) - 3;
    const int max_exp = static_cast<int>(std::floor(std::log2(table.back().first))) + 2;
    int failures = 0;
    for (int i = 0; i < kValues && failures < 10; ++i) {
      float x;
      switch (i % 4) {
        case 0:  // any fp32 bit pattern (NaN, Inf, denormals included)
          x = f32_from_bits(static_cast<uint32_t>(rng()));
          break;
        case 1: {  // uniform in exponent over the format's range
          std::uniform_int_distribution<int> e(min_exp, max_exp);
          x = std::ldexp(1.0f + static_cast<float>(rng() >> 41) * 0x1p-23f, e(rng));
          if (rng() & 1) x = -x;
          break;
        }
        default: {  // a tie between neighbours, or one fp32 ulp either side of it
          const size_t k = rng() % (table.size() - 1);
          const float mid = static_cast<float>((table[k].first + table[k + 1].first) / 2);
          const int nudge = static_cast<int>(rng() % 3) - 1;
          x = f32_from_bits(f32_bits(mid) + static_cast<uint32_t>(nudge));
          if (rng() & 1) x = -x;
        }
      }
      if (!check_one(f, ref, x)) ++failures;
    }
    EXPECT_EQ(failures, 0) << f.name;
  }
}

TEST(ConvertMath, Bf16IsExhaustivelyCorrectOnEveryFp32WithTopBitsSampled) {
  // All 2^16 low halves for a spread of high halves: every rounding
  // decision (below, tie, above) for every bf16 neighbourhood kind.
  const RefRounder ref(testing::kRefBF16);
  const auto f = formats()[0];
  const uint32_t highs[] = {0x0000, 0x0001, 0x007f, 0x0080, 0x3f80, 0x3f81, 0x7f7e, 0x7f7f, 0x7f80,
                            0x8000, 0x80ff, 0xbf80, 0xff7f, 0xff80, 0x7fc0, 0xffc1};
  int failures = 0;
  for (uint32_t hi : highs) {
    for (uint32_t lo = 0; lo < 65536 && failures < 10; ++lo) {
      if (!check_one(f, ref, f32_from_bits(hi << 16 | lo))) ++failures;
    }
  }
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace mp

namespace mp {
namespace {

TEST(ConvertMath, DivisorQuotientIsRoundedOnce) {
  // Every power-of-two and other divisor, including quotients in fp32's
  // subnormal range (where a fast fp32 product would round twice).
  std::mt19937 rng(11);
  std::vector<float> xs;
  for (int i = 0; i < 20000; ++i) {
    const int e = static_cast<int>(rng() % 300) - 150;
    float x = std::ldexp(1.0f + static_cast<float>(rng() >> 9) * 0x1p-23f, e);
    xs.push_back((rng() & 1) ? -x : x);
  }
  xs.push_back(0.0f);
  xs.push_back(-0.0f);
  xs.push_back(std::numeric_limits<float>::infinity());
  const Tensor src = Tensor::wrap(xs.data(), Device::cpu(), DType::kF32, {static_cast<int64_t>(xs.size())});
  for (double divisor : {2.0, 4.0, 1024.0, 0.5, 3.0, 6.0, 1.5}) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
      std::vector<uint8_t> packed(xs.size() * dtype_size(dt));
      const Tensor pdst = Tensor::wrap(packed.data(), Device::cpu(), dt, {static_cast<int64_t>(xs.size())});
      convert(src, pdst, ConvertOptions{.divisor = divisor});
      const RefRounder ref(dt == DType::kBF16 ? testing::kRefBF16 : testing::kRefFP16);
      for (size_t i = 0; i < xs.size(); ++i) {
        const double q = static_cast<double>(xs[i]) / divisor;
        uint32_t got = 0;
        std::memcpy(&got, packed.data() + i * dtype_size(dt), dtype_size(dt));
        const uint32_t want = dt == DType::kF32 ? f32_bits(static_cast<float>(q)) : ref.round(q);
        ASSERT_EQ(got, want) << xs[i] << " / " << divisor << " to " << dtype_name(dt);
      }
    }
  }
}

}  // namespace
}  // namespace mp

namespace mp {
namespace {

// The tensor cast fp32 -> bf16 (the gradients' wire cast, a loop per ISA)
// gives the element function's bits on every class of input: NaN, Inf,
// subnormals, ties and random patterns.
TEST(ConvertMath, TensorCastToBf16EqualsTheElementFunction) {
  std::mt19937 rng(5);
  std::vector<float> xs;
  for (uint32_t b : {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7f800000u, 0xff800000u, 0x00000001u, 0x807fffffu,
                     0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f7fffffu, 0x00000000u, 0x80000000u}) {
    xs.push_back(f32_from_bits(b));
  }
  for (int i = 0; i < 100003; ++i) xs.push_back(f32_from_bits(static_cast<uint32_t>(rng())));
  const int64_t n = static_cast<int64_t>(xs.size());
  std::vector<bf16> got(xs.size());
  convert(Tensor::wrap(xs.data(), Device::cpu(), DType::kF32, {n}), Tensor::wrap(got.data(), Device::cpu(), DType::kBF16, {n}));
  int64_t bad = 0;
  for (size_t i = 0; i < xs.size(); ++i) bad += got[i].bits != math::from_f32<bf16>(xs[i]).bits ? 1 : 0;
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace mp

// bf16_remainder: every fp32 bit pattern splits into (bf16 copy, int16
// remainder) and merges back exactly (NaN stays NaN of the same sign), the
// copy is nearest with ties away from zero, and a training trajectory in
// this mode is bitwise that of an fp32 master.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cpu/update.h"
#include "kernels/remainder_math.h"
#include "mp/config.h"

namespace mp {
namespace {

// Checks patterns [begin, end) with the given stride; returns failures.
uint64_t check_patterns(uint64_t begin, uint64_t end, uint64_t stride, uint32_t* first_bad) {
  uint64_t bad = 0;
  for (uint64_t x = begin; x < end; x += stride) {
    const uint32_t u = static_cast<uint32_t>(x);
    const float f = math::f32_from_bits(u);
    const math::Bf16Remainder s = math::split_bf16_remainder(f);
    const float back = math::merge_bf16_remainder(s.h, s.r);
    bool ok;
    if (std::isnan(f)) {
      ok = std::isnan(back) && std::signbit(back) == std::signbit(f) &&
           std::isnan(math::bf16_bits_to_f32(s.h)) && (s.h >> 15) == (u >> 31);
    } else {
      // Exact, and the copy is nearest-even except on exact ties, which go
      // away from zero.
      const bool tie = (u & 0xffffu) == 0x8000u;
      const uint16_t away = static_cast<uint16_t>((u >> 16) + 1);
      ok = math::f32_bits(back) == u && (tie ? s.h == away : s.h == math::f32_to_bf16_bits(f));
    }
    if (!ok && bad++ == 0) *first_bad = u;
  }
  return bad;
}

TEST(Bf16Remainder, EveryFp32PatternSplitsAndMergesExactly) {
  // All 2^32 patterns on two threads; under sanitizers every 97th pattern
  // plus the special ranges (a sanitizer checks memory, not arithmetic).
  const uint64_t stride = MP_SANITIZE ? 97 : 1;
  std::atomic<uint64_t> bad{0};
  std::atomic<uint32_t> first{0};
  std::vector<std::thread> threads;
  const int n = 2;
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      uint32_t f = 0;
      const uint64_t lo = (uint64_t{1} << 32) * t / n, hi = (uint64_t{1} << 32) * (t + 1) / n;
      const uint64_t b = check_patterns(lo, hi, stride, &f);
      if (b) first = f;
      bad += b;
    });
  }
  for (auto& th : threads) th.join();
  uint32_t f = 0;
  for (uint64_t base : {0x00000000ull, 0x7f7f0000ull, 0x7f800000ull, 0x80000000ull, 0xff7f0000ull, 0xff800000ull}) {
    bad += check_patterns(base, base + 0x20000, 1, &f);  // around zero, max, Inf and NaN
  }
  EXPECT_EQ(bad.load(), 0u) << "first bad pattern 0x" << std::hex << (first.load() ? first.load() : f);
}

TEST(Bf16Remainder, NaNAndInfAreHandled) {
  // apex's bit trick turns 0x7fffffff (NaN) into -0; here it stays NaN.
  for (uint32_t u : {0x7fffffffu, 0xffffffffu, 0x7f800001u, 0xff800001u, 0x7fc00000u}) {
    const auto s = math::split_bf16_remainder(math::f32_from_bits(u));
    EXPECT_TRUE(std::isnan(math::bf16_bits_to_f32(s.h))) << std::hex << u;
    EXPECT_TRUE(std::isnan(math::merge_bf16_remainder(s.h, s.r))) << std::hex << u;
  }
  const auto inf = math::split_bf16_remainder(INFINITY);
  EXPECT_EQ(inf.h, 0x7f80);
  EXPECT_EQ(inf.r, 0);
  const auto big = math::split_bf16_remainder(math::f32_from_bits(0x7f7fffffu));  // fp32 max
  EXPECT_EQ(big.h, 0x7f80) << "rounds to an Inf copy, as nearest rounding does";
  EXPECT_EQ(math::f32_bits(math::merge_bf16_remainder(big.h, big.r)), 0x7f7fffffu);
}

TEST(Bf16Remainder, TrajectoryIsBitwiseThatOfAnFp32Master) {
  const int64_t n = 4096;
  std::mt19937_64 rng(21);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> master(n), m32(n, 0), v32(n, 0), m16(n, 0), v16(n, 0);
  for (auto& p : master) p = normal(rng);
  std::vector<uint16_t> h(n);
  std::vector<int16_t> r(n);
  for (int64_t i = 0; i < n; ++i) {
    const auto s = math::split_bf16_remainder(master[i]);
    h[i] = s.h;
    r[i] = s.r;
  }
  std::vector<uint16_t> copy(n);
  int copies_differ = 0;
  for (int t = 1; t <= 1000; ++t) {
    std::vector<float> g(n);
    for (auto& x : g) x = normal(rng) * 20;
    UpdateArgs a;
    a.n = n;
    a.grad = g.data();
    a.hyper.weight_decay = 0.1f;
    StepScalars sc;
    sc.step = t;
    UpdateArgs fp32 = a, rem = a;
    fp32.master = master.data();
    fp32.state0 = m32.data();
    fp32.state1 = v32.data();
    fp32.param_out = copy.data();
    rem.master_mode = MasterMode::kBf16Remainder;
    rem.param_out = h.data();
    rem.master_remainder = r.data();
    rem.state0 = m16.data();
    rem.state1 = v16.data();
    fused_update_cpu(fp32, sc);
    fused_update_cpu(rem, sc);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(math::f32_bits(math::merge_bf16_remainder(h[i], r[i])), math::f32_bits(master[i]))
          << "step " << t << " element " << i;
      copies_differ += h[i] != copy[i];  // RNE vs ties-away: only on exact ties
    }
  }
  EXPECT_LE(copies_differ, 4096 * 1000 / 1000) << "copies may differ only on exact ties (about 2^-16)";
}

}  // namespace
}  // namespace mp

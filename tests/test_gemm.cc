// The CPU GEMM (kernels/cpu/gemm.h): every transpose combination, odd sizes,
// fp32 and bf16 inputs, bias and accumulate against a float64 loop; leading
// dimensions larger than the rows; tiles; thread-count independence; errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/gemm.h"

namespace mp {
namespace {

// A stored matrix of `rows` x `cols` with leading dimension ld (>= cols),
// random values; bf16 copies hold the values rounded to nearest even, and
// `exact` holds the values the product sees (the bf16 ones for bf16).
struct Stored {
  int64_t rows = 0, cols = 0, ld = 0;
  DType dtype = DType::kF32;
  std::vector<float> f32;
  std::vector<bf16> b16;
  std::vector<double> exact;

  Stored(int64_t r, int64_t c, int64_t pad, DType t, uint32_t seed) : rows(r), cols(c), ld(c + pad), dtype(t) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const auto n = static_cast<size_t>(std::max<int64_t>(rows * ld, 1));
    f32.resize(n);
    for (float& x : f32) x = u(rng);
    b16.resize(n);
    exact.resize(n);
    for (size_t i = 0; i < n; ++i) {
      b16[i] = math::from_f32<bf16>(f32[i]);
      exact[i] = t == DType::kBF16 ? static_cast<double>(math::to_f32(b16[i])) : static_cast<double>(f32[i]);
    }
  }
  GemmInput input(bool transposed) const {
    const void* data = dtype == DType::kBF16 ? static_cast<const void*>(b16.data()) : f32.data();
    return GemmInput{data, dtype, ld, transposed};
  }
  double at(int64_t r, int64_t c) const { return exact[static_cast<size_t>(r * ld + c)]; }
};

struct Case {
  int64_t m, n, k;
  bool ta, tb, bias, accumulate;
  DType a_dtype, b_dtype;
  int threads;
};

std::string describe(const Case& c) {
  return detail::str(c.m, "x", c.n, "x", c.k, c.ta ? " A^T" : " A", c.tb ? " B^T" : " B", c.bias ? " +bias" : "",
                     c.accumulate ? " +=" : "", " ", dtype_name(c.a_dtype), "x", dtype_name(c.b_dtype), " ",
                     c.threads, "t");
}

// Runs the case; against the float64 loop when `verify`. Returns C.
std::vector<float> run(const Case& c, uint32_t seed, bool verify) {
  // Stored shapes: A [m, k] or [k, m]; B [k, n] or [n, k]; padded leading dims.
  const Stored a = c.ta ? Stored(c.k, c.m, 3, c.a_dtype, seed) : Stored(c.m, c.k, 1, c.a_dtype, seed);
  const Stored b = c.tb ? Stored(c.n, c.k, 2, c.b_dtype, seed + 1) : Stored(c.k, c.n, 5, c.b_dtype, seed + 2);
  const Stored bias(1, c.n, 0, DType::kF32, seed + 3);
  const int64_t ldc = c.n + 4;
  const Stored c0(c.m, c.n, 4, DType::kF32, seed + 4);
  std::vector<float> out = c0.f32;  // the initial C (accumulate adds to it)
  GemmProblem p;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.a = a.input(c.ta);
  p.b = b.input(c.tb);
  p.bias = c.bias ? bias.f32.data() : nullptr;
  p.c = out.data();
  p.ldc = ldc;
  p.accumulate = c.accumulate;
  GemmOptions o;
  o.threads = c.threads;
  gemm_cpu(p, o);
  if (!verify) return out;
  double max_rel = 0.0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t l = 0; l < c.k; ++l) {
        const double x = c.ta ? a.at(l, i) : a.at(i, l);
        const double y = c.tb ? b.at(j, l) : b.at(l, j);
        sum += x * y;
        magnitude += std::abs(x * y);
      }
      if (c.bias) {
        sum += bias.at(0, j);
        magnitude += std::abs(bias.at(0, j));
      }
      if (c.accumulate) {
        sum += c0.at(i, j);
        magnitude += std::abs(c0.at(i, j));
      }
      const double got = out[static_cast<size_t>(i * ldc + j)];
      // fp32 rounding errors, relative to the sum of |terms|: 1e-6 up to
      // k = 130, growing like the sqrt(k) of a random walk beyond.
      const double tol = 1e-6 * std::sqrt(std::max(1.0, static_cast<double>(c.k) / 130.0)) * magnitude + 1e-30;
      max_rel = std::max(max_rel, std::abs(got - sum) / (magnitude + 1e-30));
      EXPECT_NEAR(got, sum, tol) << describe(c) << " at (" << i << ", " << j << ")";
    }
    // The padding between rows of C is untouched.
    for (int64_t j = c.n; j < ldc; ++j) {
      const auto idx = static_cast<size_t>(i * ldc + j);
      EXPECT_EQ(out[idx], c0.f32[idx]) << describe(c) << " wrote padding at (" << i << ", " << j << ")";
    }
  }
  ::testing::Test::RecordProperty("max_rel_err", std::to_string(max_rel));
  return out;
}

std::vector<float> check(const Case& c, uint32_t seed) { return run(c, seed, true); }

TEST(Gemm, EveryTransposeOddSizesBiasAccumulateFp32AndBf16) {
  const int64_t sizes[] = {1, 7, 33, 130};
  uint32_t seed = 1;
  for (const int64_t m : sizes) {
    for (const int64_t n : sizes) {
      for (const int64_t k : sizes) {
        for (const int mode : {0, 1, 2, 3}) {
          const bool ta = (mode & 1) != 0, tb = (mode & 2) != 0;
          // Cycle the other options through the shapes, so each appears with
          // every transpose and most sizes without a 4^3 x 4 x 16 sweep.
          const auto v = static_cast<uint32_t>(m * 31 + n * 7 + k + mode);
          const bool bias = (v & 1) != 0, accumulate = (v & 2) != 0;
          const DType a_dtype = (v & 4) != 0 ? DType::kBF16 : DType::kF32;
          const DType b_dtype = (v & 8) != 0 ? DType::kBF16 : DType::kF32;
          check(Case{m, n, k, ta, tb, bias, accumulate, a_dtype, b_dtype, 2}, seed++);
        }
      }
    }
  }
}

TEST(Gemm, AllOptionCombinationsAtOneShape) {
  uint32_t seed = 100;
  for (const int mode : {0, 1, 2, 3}) {
    for (const bool bias : {false, true}) {
      for (const bool accumulate : {false, true}) {
        for (const DType a : {DType::kF32, DType::kBF16}) {
          for (const DType b : {DType::kF32, DType::kBF16}) {
            check(Case{33, 130, 7, (mode & 1) != 0, (mode & 2) != 0, bias, accumulate, a, b, 1}, seed++);
          }
        }
      }
    }
  }
}

TEST(Gemm, ManyTilesMatchTheLoopAndDoNotDependOnTheThreadCount) {
  // Long sides split into several tiles (gemm_tiling), with remainders.
  for (const Case& c : {Case{5, 4099, 33, false, true, true, false, DType::kF32, DType::kF32, 1},
                        Case{4099, 9, 20, true, false, false, true, DType::kF32, DType::kF32, 1},
                        Case{200, 1000, 70, false, false, true, true, DType::kBF16, DType::kBF16, 1},
                        Case{64, 700, 3000, false, false, false, false, DType::kF32, DType::kF32, 1}}) {
    const GemmTiling t = gemm_tiling(c.m, c.n, c.k);
    EXPECT_TRUE(t.tile_m < c.m || t.tile_n < c.n) << describe(c) << ": one tile";
    const std::vector<float> ref = check(c, 7);
    for (int threads : {2, 3, 5}) {
      Case ct = c;
      ct.threads = threads;
      const std::vector<float> got = run(ct, 7, false);
      int64_t differ = 0, first = -1;
      for (size_t i = 0; i < ref.size(); ++i) {
        if (std::memcmp(&got[i], &ref[i], sizeof(float)) != 0) {
          if (first < 0) first = static_cast<int64_t>(i);
          ++differ;
        }
      }
      EXPECT_EQ(differ, 0) << describe(ct) << ": first at " << first << " (row " << first / (c.n + 4) << ", column "
                           << first % (c.n + 4) << "): " << (first >= 0 ? got[static_cast<size_t>(first)] : 0.0f)
                           << " vs " << (first >= 0 ? ref[static_cast<size_t>(first)] : 0.0f);
    }
  }
}

TEST(Gemm, TilingDependsOnTheShapeOnly) {
  for (int64_t m : {1, 64, 256, 50304}) {
    for (int64_t n : {1, 768, 2304, 50304}) {
      const GemmTiling t = gemm_tiling(m, n, 768);
      EXPECT_GE(t.tile_m, 1);
      EXPECT_GE(t.tile_n, 1);
      EXPECT_LE(t.tile_m, m);
      EXPECT_LE(t.tile_n, n);
    }
  }
}

TEST(Gemm, ZeroSizes) {
  std::vector<float> c(6, 5.0f);
  const std::vector<float> bias = {1, 2, 3};
  const float dummy = 0.0f;
  GemmProblem p;
  p.m = 2;
  p.n = 3;
  p.k = 0;
  p.a = GemmInput{&dummy, DType::kF32, 1, false};
  p.b = GemmInput{&dummy, DType::kF32, 3, false};
  p.c = c.data();
  p.ldc = 3;
  gemm_cpu(p);
  EXPECT_EQ(c, std::vector<float>(6, 0.0f));
  p.bias = bias.data();
  p.accumulate = true;
  gemm_cpu(p);
  EXPECT_EQ(c, (std::vector<float>{1, 2, 3, 1, 2, 3}));
  p.m = 0;  // nothing to do, nothing read
  p.c = nullptr;
  EXPECT_NO_THROW(gemm_cpu(p));
}

TEST(Gemm, CallerScratchIsUsedForWidenedInputs) {
  const Stored a(40, 50, 0, DType::kBF16, 1), b(50, 60, 0, DType::kBF16, 2);
  std::vector<float> c1(40 * 60), c2(40 * 60);
  GemmProblem p;
  p.m = 40;
  p.n = 60;
  p.k = 50;
  p.a = a.input(false);
  p.b = b.input(false);
  p.c = c1.data();
  p.ldc = 60;
  const int64_t need = gemm_scratch_elements(p);
  EXPECT_EQ(need, gemm_native_bf16() ? 0 : 40 * 50 + 50 * 60);
  std::vector<float> scratch(static_cast<size_t>(need));
  GemmOptions o;
  o.scratch = scratch.data();
  o.scratch_elements = need;
  gemm_cpu(p, o);
  p.c = c2.data();
  gemm_cpu(p);
  EXPECT_EQ(c1, c2);
  RecordProperty("native_bf16", gemm_native_bf16() ? "true" : "false");
  RecordProperty("describe", gemm_describe());
  EXPECT_EQ(gemm_bf16_storage(), gemm_native_bf16() ? DType::kBF16 : DType::kF32);
}

// Note [bf16 GEMMs on the CPU]: bf16 operands forced widened to fp32 and
// forced native (where oneDNN has a bf16 kernel) on the same inputs. Each
// is bitwise the same for 1 and 2 threads; both are within fp32 summation
// rounding of the exact (float64) product of the bf16 values, so within
// twice that of each other: the products are exact in fp32 either way and
// only the order of the k additions differs, each sum within
// (k - 1) u sum_l |a_il b_lj| of the exact one (u = 2^-24).
TEST(Gemm, Bf16WidenedAndNativeAgreeWithinFp32SummationAndNeitherDependsOnThreads) {
  const int64_t m = 70, n = 90, k = 300;
  const Stored a(m, k, 1, DType::kBF16, 11), b(k, n, 3, DType::kBF16, 12);
  std::vector<Bf16Gemm> paths = {Bf16Gemm::kWidened};
  if (gemm_bf16_kernel_available()) paths.push_back(Bf16Gemm::kNative);
  std::vector<std::vector<float>> out;
  for (Bf16Gemm path : paths) {
    std::vector<float> by_threads[2];
    for (int t = 0; t < 2; ++t) {
      by_threads[t].assign(static_cast<size_t>(m * n), 0.0f);
      GemmProblem p;
      p.m = m;
      p.n = n;
      p.k = k;
      p.a = a.input(false);
      p.b = b.input(false);
      p.c = by_threads[t].data();
      p.ldc = n;
      GemmOptions o;
      o.threads = t + 1;
      o.bf16 = path;
      gemm_cpu(p, o);
    }
    EXPECT_EQ(0, std::memcmp(by_threads[0].data(), by_threads[1].data(), by_threads[0].size() * sizeof(float)))
        << (path == Bf16Gemm::kNative ? "native" : "widened") << ": 1 and 2 threads differ";
    out.push_back(by_threads[0]);
  }
  const double u = std::ldexp(1.0, -24);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t l = 0; l < k; ++l) {
        exact += a.at(i, l) * b.at(l, j);
        magnitude += std::abs(a.at(i, l) * b.at(l, j));
      }
      const double bound = static_cast<double>(k - 1) * u * magnitude;
      for (size_t q = 0; q < out.size(); ++q) {
        ASSERT_LE(std::abs(out[q][static_cast<size_t>(i * n + j)] - exact), bound) << "path " << q << " at " << i
                                                                                    << ", " << j;
      }
    }
  }
  if (!gemm_bf16_kernel_available()) {
    GemmProblem p;
    p.m = p.n = p.k = 1;
    float x = 0;
    const bf16 one = math::from_f32<bf16>(1.0f);
    p.a = GemmInput{&one, DType::kBF16, 1, false};
    p.b = p.a;
    p.c = &x;
    p.ldc = 1;
    GemmOptions o;
    o.bf16 = Bf16Gemm::kNative;
    EXPECT_THROW(gemm_cpu(p, o), EnforceError);
  }
  RecordProperty("bf16_gemm", gemm_bf16_reason());
}

TEST(Gemm, AliasedLeadingDimensionIsStagedWithTheSameBits) {
  // B's rows 4 KiB apart (ld 1024 floats) are re-laid with a padded leading
  // dimension first; the product is the one oneDNN computes for that layout.
  const int64_t m = 64, n = 1024, k = 300;
  const Stored a(m, k, 0, DType::kF32, 1), b(k, n, 0, DType::kF32, 2);
  Stored padded(k, n, 16, DType::kF32, 3);  // b's values, rows 1040 floats apart
  for (int64_t r = 0; r < k; ++r) {
    std::copy(b.f32.begin() + r * n, b.f32.begin() + (r + 1) * n, padded.f32.begin() + r * (n + 16));
  }
  std::vector<float> c1(static_cast<size_t>(m * n)), c2(c1.size());
  GemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a = a.input(false);
  p.b = b.input(false);
  p.c = c1.data();
  p.ldc = n;
  EXPECT_GT(gemm_scratch_elements(p), 0);
  gemm_cpu(p);
  GemmProblem q = p;
  q.b = padded.input(false);
  q.c = c2.data();
  EXPECT_EQ(gemm_scratch_elements(q), 0);
  gemm_cpu(q);
  EXPECT_EQ(c1, c2);
  std::vector<float> c3(c1.size());
  GemmOptions o;
  std::vector<float> scratch(static_cast<size_t>(gemm_scratch_elements(p)));
  o.scratch = scratch.data();
  o.scratch_elements = static_cast<int64_t>(scratch.size());
  p.c = c3.data();
  gemm_cpu(p, o);
  EXPECT_EQ(c1, c3);
}

TEST(Gemm, BadArgumentsThrow) {
  std::vector<float> x(100), c(100);
  GemmProblem p;
  p.m = 4;
  p.n = 5;
  p.k = 6;
  p.a = GemmInput{x.data(), DType::kF32, 6, false};
  p.b = GemmInput{x.data(), DType::kF32, 5, false};
  p.c = c.data();
  p.ldc = 5;
  EXPECT_NO_THROW(gemm_cpu(p));
  GemmProblem q = p;
  q.a.ld = 5;  // < k
  EXPECT_THROW(gemm_cpu(q), EnforceError);
  q = p;
  q.b.transposed = true;  // stored [n, k]: ld must be >= k = 6
  EXPECT_THROW(gemm_cpu(q), EnforceError);
  q = p;
  q.ldc = 4;
  EXPECT_THROW(gemm_cpu(q), EnforceError);
  q = p;
  q.a.dtype = DType::kF16;
  EXPECT_THROW(gemm_cpu(q), EnforceError);
  q = p;
  q.b.data = nullptr;
  EXPECT_THROW(gemm_cpu(q), EnforceError);
  q = p;
  q.k = -1;
  EXPECT_THROW(gemm_cpu(q), EnforceError);
}

}  // namespace
}  // namespace mp

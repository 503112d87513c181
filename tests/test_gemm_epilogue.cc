// The CPU GEMM's epilogue (Note [GEMM epilogue] in kernels/gemm_problem.h):
// bf16 outputs (stored as bf16 and as fp32 holding bf16 values), the bias,
// the addend, the GELU with its saved pre-activation, its gradient, and the
// bias gradient of op(B), each against a float64 loop over the same input
// values, with bounds derived from the fp32 accumulation and one bf16
// rounding; the bits independent of the thread count; bad problems refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/gemm.h"
#include "kernels/gpt_math.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::contains;
using testing::error_of;

// A row-major [rows, cols] matrix of random values in [-1, 1): as stored
// (fp32 or bf16) and the values the product sees, in double.
struct Matrix {
  int64_t rows = 0, cols = 0;
  DType dtype = DType::kF32;
  std::vector<float> f32;
  std::vector<bf16> b16;
  std::vector<double> exact;

  Matrix(int64_t r, int64_t c, DType t, uint32_t seed) : rows(r), cols(c), dtype(t) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const auto n = static_cast<size_t>(r * c);
    f32.resize(n);
    b16.resize(n);
    exact.resize(n);
    for (size_t i = 0; i < n; ++i) {
      f32[i] = u(rng);
      b16[i] = math::from_f32<bf16>(f32[i]);
      exact[i] = t == DType::kBF16 ? static_cast<double>(math::to_f32(b16[i])) : static_cast<double>(f32[i]);
    }
  }
  GemmInput input(bool transposed) const {
    return GemmInput{dtype == DType::kBF16 ? static_cast<const void*>(b16.data()) : f32.data(), dtype, cols,
                     transposed};
  }
  double at(int64_t r, int64_t c) const { return exact[static_cast<size_t>(r * cols + c)]; }
};

// An output of m x n values stored as `dtype` (bf16 values where bf16).
struct Out {
  DType dtype;
  bool holds_bf16;
  std::vector<float> f32;
  std::vector<bf16> b16;
  Out(int64_t n, DType d, bool b) : dtype(d), holds_bf16(b || d == DType::kBF16) {
    f32.assign(static_cast<size_t>(n), -7.0f);  // poison: every element must be written
    b16.assign(static_cast<size_t>(n), math::from_f32<bf16>(-7.0f));
  }
  void* data() { return dtype == DType::kBF16 ? static_cast<void*>(b16.data()) : f32.data(); }
  double at(size_t i) const { return dtype == DType::kBF16 ? math::to_f32(b16[i]) : f32[i]; }
};

struct EpilogueCase {
  int64_t m, n, k;
  DType in, out;
  bool c_bf16, bias, addend;
  GemmEpilogue epilogue;
  bool bias_grad, b_transposed;
};

std::string describe(const EpilogueCase& c) {
  return detail::str(c.m, "x", c.n, "x", c.k, " ", dtype_name(c.in), " -> ", dtype_name(c.out),
                     c.c_bf16 ? " (bf16 values)" : "", c.bias ? " +bias" : "", c.addend ? " +addend" : "",
                     c.epilogue == GemmEpilogue::kGelu ? " gelu" : c.epilogue == GemmEpilogue::kDGelu ? " dgelu" : "",
                     c.bias_grad ? " bias-grad" : "", c.b_transposed ? " B^T" : "");
}

struct Result {
  std::vector<double> c, aux, bias_grad;
};

// Runs the case on `threads` threads and checks it against float64; returns C.
Result run(const EpilogueCase& c, int threads, bool verify = true) {
  const Matrix a(c.m, c.k, c.in, 11), b = c.b_transposed ? Matrix(c.n, c.k, c.in, 12) : Matrix(c.k, c.n, c.in, 12);
  const Matrix bias(1, c.n, DType::kF32, 13), addend(c.m, c.n, DType::kF32, 14), pre(c.m, c.n, DType::kF32, 15);
  Out out(c.m * c.n, c.out, c.c_bf16), aux(c.m * c.n, c.out, c.c_bf16);
  if (c.epilogue == GemmEpilogue::kDGelu) {  // the forward's pre-activation, as C stores it
    for (size_t i = 0; i < aux.f32.size(); ++i) {
      const float v = 3.0f * pre.f32[i];
      aux.b16[i] = math::from_f32<bf16>(v);
      aux.f32[i] = aux.holds_bf16 ? math::to_f32(aux.b16[i]) : v;
    }
  }
  std::vector<float> bias_grad(static_cast<size_t>(c.n), -7.0f);
  GemmProblem p = gemm_problem(c.m, c.n, c.k, a.input(false), b.input(c.b_transposed), out.data(), c.out, c.c_bf16,
                               c.bias ? bias.f32.data() : nullptr);
  p.addend = c.addend ? addend.f32.data() : nullptr;
  p.epilogue = c.epilogue;
  p.aux = c.epilogue != GemmEpilogue::kNone ? aux.data() : nullptr;
  p.aux_ld = c.n;
  p.bias_grad = c.bias_grad ? bias_grad.data() : nullptr;
  GemmOptions o;
  o.threads = threads;
  gemm_cpu(p, o);
  Result r;
  for (size_t i = 0; i < out.f32.size(); ++i) {
    r.c.push_back(out.at(i));
    r.aux.push_back(aux.at(i));
  }
  r.bias_grad.assign(bias_grad.begin(), bias_grad.end());
  if (!verify) return r;
  // Bounds: the fp32 sum of k products is within k 2^-24 of the sum of
  // their magnitudes (plus the bias and addend, one rounding each); GELU and
  // its gradient (exp_approx, about 2 ulp) keep that within a factor 4 of
  // the argument's error plus 1e-6 relative; a bf16 output adds at most
  // 2^-8 of its value (nearest even, 8 significant bits).
  const double u32 = std::ldexp(1.0, -24), u16 = std::ldexp(1.0, -8);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double v = 0.0, magnitude = 0.0;
      for (int64_t l = 0; l < c.k; ++l) {
        const double x = a.at(i, l), y = c.b_transposed ? b.at(j, l) : b.at(l, j);
        v += x * y;
        magnitude += std::abs(x * y);
      }
      if (c.bias) v += bias.at(0, j), magnitude += std::abs(bias.at(0, j));
      if (c.addend) v += addend.at(i, j), magnitude += std::abs(addend.at(i, j));
      const auto idx = static_cast<size_t>(i * c.n + j);
      double err = (static_cast<double>(c.k) + 2) * u32 * magnitude;
      if (c.epilogue == GemmEpilogue::kGelu) {
        EXPECT_NEAR(r.aux[idx], v, err + (aux.holds_bf16 ? u16 * std::abs(v) : 0.0)) << describe(c) << " aux " << i << "," << j;
        const double g = v / (1.0 + std::exp(-2.0 * math::kGeluSqrt2OverPi * (v + math::kGeluCubic * v * v * v)));
        err = 4.0 * err + 1e-6 * std::abs(g);
        v = g;
      } else if (c.epilogue == GemmEpilogue::kDGelu) {
        const double x = r.aux[idx];
        const double s = math::kGeluSqrt2OverPi, a3 = math::kGeluCubic, u = s * (x + a3 * x * x * x);
        const double sig = 1.0 / (1.0 + std::exp(-2.0 * u));
        const double d = sig + 2.0 * x * sig * (1.0 - sig) * s * (1.0 + 3.0 * a3 * x * x);
        v *= d;
        err = err * std::abs(d) + 1e-6 * std::abs(v);
      }
      if (out.holds_bf16) err += u16 * std::abs(v);
      EXPECT_NEAR(r.c[idx], v, err + 1e-30) << describe(c) << " at " << i << "," << j;
      if (out.holds_bf16) {
        EXPECT_EQ(r.c[idx], math::to_f32(math::from_f32<bf16>(static_cast<float>(r.c[idx]))));
      }
    }
  }
  if (c.bias_grad) {
    for (int64_t j = 0; j < c.n; ++j) {
      double s = 0.0, magnitude = 0.0;
      for (int64_t l = 0; l < c.k; ++l) {
        const double y = c.b_transposed ? b.at(j, l) : b.at(l, j);
        s += y;
        magnitude += std::abs(y);
      }
      EXPECT_NEAR(r.bias_grad[static_cast<size_t>(j)], s, static_cast<double>(c.k) * u32 * magnitude + 1e-30)
          << describe(c) << " bias gradient " << j;
    }
  }
  return r;
}

const auto F = DType::kF32, B = DType::kBF16;
const auto kNone = GemmEpilogue::kNone, kGelu = GemmEpilogue::kGelu, kDGelu = GemmEpilogue::kDGelu;

TEST(GemmEpilogue, EveryPartMatchesFloat64) {
  const EpilogueCase cases[] = {
      {37, 53, 29, B, B, false, true, false, kNone, false, false},   // bf16 out + bias: the qkv GEMM
      {37, 53, 29, B, F, false, true, true, kNone, false, false},    // fp32 out + bias + residual
      {37, 53, 29, B, B, false, true, false, kGelu, false, false},   // c_fc + gelu
      {37, 53, 29, B, B, false, false, false, kDGelu, false, true},  // d fch through the gelu
      {37, 53, 29, B, F, false, false, false, kNone, true, false},   // d weight + d bias
      {37, 53, 29, B, F, false, false, false, kNone, true, true},    // ... of a transposed B
      {37, 53, 29, F, F, true, true, false, kGelu, false, false},    // bf16 values in fp32 storage
      {37, 53, 29, F, F, false, true, true, kNone, true, false},     // fp32 throughout
      {300, 200, 70, B, B, false, true, false, kGelu, false, false}, // several tiles
      {5, 3, 0, B, B, false, true, false, kGelu, true, false},       // k = 0
      {1, 1, 1, F, B, false, false, false, kDGelu, false, false},
  };
  for (const EpilogueCase& c : cases) run(c, 2);
}

// bf16 values stored as fp32 are the bf16 output's values exactly.
TEST(GemmEpilogue, Bf16ValuesInFp32StorageAreTheBf16Output) {
  for (GemmEpilogue e : {kNone, kGelu}) {
    const Result b16 = run({41, 67, 33, B, B, false, true, false, e, false, false}, 2, false);
    const Result f32 = run({41, 67, 33, B, F, true, true, false, e, false, false}, 2, false);
    EXPECT_EQ(b16.c, f32.c);
    EXPECT_EQ(b16.aux, f32.aux);
  }
}

TEST(GemmEpilogue, BitsDoNotDependOnTheThreadCount) {
  for (const EpilogueCase& c : {EpilogueCase{300, 200, 70, B, B, false, true, false, kGelu, false, false},
                                EpilogueCase{300, 200, 70, B, F, false, true, true, kNone, true, false},
                                EpilogueCase{300, 200, 70, B, B, false, false, false, kDGelu, true, true}}) {
    const Result one = run(c, 1, false), two = run(c, 2, false), three = run(c, 3, false);
    EXPECT_EQ(one.c, two.c) << describe(c);
    EXPECT_EQ(one.c, three.c) << describe(c);
    EXPECT_EQ(one.aux, two.aux) << describe(c);
    EXPECT_EQ(one.bias_grad, three.bias_grad) << describe(c);
  }
}

TEST(GemmEpilogue, BadProblemsAreRefused) {
  const Matrix a(4, 4, B, 1), b(4, 4, B, 2);
  std::vector<bf16> c16(16);
  std::vector<float> c32(16), add(16), aux(16);
  GemmProblem p = gemm_problem(4, 4, 4, a.input(false), b.input(false), c16.data(), B, true);
  p.addend = add.data();
  EXPECT_PRED2(contains, error_of<EnforceError>([&] { gemm_cpu(p); }), "gemm addend: only with an fp32 C");
  p = gemm_problem(4, 4, 4, a.input(false), b.input(false), c32.data());
  p.accumulate = true;
  p.epilogue = kGelu;
  p.aux = aux.data();
  p.aux_ld = 4;
  EXPECT_PRED2(contains, error_of<EnforceError>([&] { gemm_cpu(p); }), "gemm accumulate: only into an fp32 C");
  p.accumulate = false;
  p.aux_ld = 3;
  EXPECT_PRED2(contains, error_of<EnforceError>([&] { gemm_cpu(p); }), "gemm GELU epilogue: aux");
  p.aux_ld = 4;
  p.epilogue = kDGelu;
  p.bias = add.data();
  EXPECT_PRED2(contains, error_of<EnforceError>([&] { gemm_cpu(p); }), "gemm DGELU epilogue: takes no bias");
  p = gemm_problem(4, 4, 4, a.input(false), b.input(false), c32.data(), DType::kF16, false);
  EXPECT_PRED2(contains, error_of<EnforceError>([&] { gemm_cpu(p); }), "gemm output in fp16");
}

}  // namespace
}  // namespace mp

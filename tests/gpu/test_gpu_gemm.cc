// GPU tests (label "gpu"): the cuBLASLt GEMM (kernels/cuda/gemm_cublaslt.h)
// against a float64 product of the same (bf16-rounded) values for every
// layout, dtype pair, bias and accumulate, its GELU epilogues against
// float64 and, in their kernel form, against the GELU kernels bit for bit,
// and its plan per alignment class. Every GEMM runs twice and must give the
// same bits.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/gpt_ops.h"
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/cuda/gpt_ops_cuda.h"
#include "tests/gpu/gpu_data.h"
#include "tests/gpu/gpu_test.h"

namespace mp {
namespace {

using namespace mp::testing;  // NOLINT(build/namespaces): the shared test data helpers

class GpuGemm : public testing::GpuStreamTest {};

// ---- GEMM -----------------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k;
  bool a_t, b_t;
  DType a_dtype, b_dtype;
  bool bias, accumulate, tf32;
  int64_t ld_pad;  // extra elements per stored row
  int64_t offset;  // elements past the allocation start (misaligned pointers)
};

// A stored matrix of random values (bf16-representable when bf16): the
// device bytes and the values as doubles (row-major, ld).
struct StoredMatrix {
  std::vector<double> values;
  std::vector<uint8_t> bytes;
};

StoredMatrix make_stored(int64_t rows, int64_t ld, DType dtype, uint64_t seed, int64_t offset) {
  const auto x = random_floats(static_cast<size_t>(rows * ld + offset), seed);
  StoredMatrix s;
  s.values.resize(x.size());
  s.bytes.resize(x.size() * dtype_size(dtype));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == DType::kBF16) {
      const uint16_t h = math::f32_to_bf16_bits(x[i]);
      std::memcpy(&s.bytes[2 * i], &h, 2);
      s.values[i] = math::bf16_bits_to_f32(h);
    } else {
      std::memcpy(&s.bytes[4 * i], &x[i], 4);
      s.values[i] = x[i];
    }
  }
  return s;
}

std::string describe(const GemmCase& c) {
  return detail::str(c.m, "x", c.n, "x", c.k, " A ", dtype_name(c.a_dtype), c.a_t ? "^T" : "", " B ",
                     dtype_name(c.b_dtype), c.b_t ? "^T" : "", c.bias ? " bias" : "", c.accumulate ? " acc" : "",
                     c.tf32 ? " tf32" : "", " ld+", c.ld_pad, " offset ", c.offset);
}

// Runs the case on the device and checks it against the float64 product;
// returns C as computed.
std::vector<float> check_gemm(const GemmCase& c, cudaStream_t stream) {
  SCOPED_TRACE(describe(c));
  const int64_t a_rows = c.a_t ? c.k : c.m, a_cols = c.a_t ? c.m : c.k;
  const int64_t b_rows = c.b_t ? c.n : c.k, b_cols = c.b_t ? c.k : c.n;
  const int64_t lda = a_cols + c.ld_pad, ldb = b_cols + c.ld_pad, ldc = c.n + c.ld_pad;
  const StoredMatrix a = make_stored(a_rows, lda, c.a_dtype, 11, c.offset);
  const StoredMatrix b = make_stored(b_rows, ldb, c.b_dtype, 12, c.offset);
  const auto c0 = random_floats(static_cast<size_t>(c.m * ldc + c.offset), 13);
  const auto bias = random_floats(static_cast<size_t>(c.n + c.offset), 14);

  DeviceVector<uint8_t> da(a.bytes, stream), db(b.bytes, stream);
  DeviceVector<float> dc(c0, stream), dbias(bias, stream);
  GemmProblem p;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.a = GemmInput{da.get() + c.offset * dtype_size(c.a_dtype), c.a_dtype, lda, c.a_t};
  p.b = GemmInput{db.get() + c.offset * dtype_size(c.b_dtype), c.b_dtype, ldb, c.b_t};
  p.bias = c.bias ? dbias.get() + c.offset : nullptr;
  p.c = dc.get() + c.offset;
  p.ldc = ldc;
  p.accumulate = c.accumulate;
  GemmCudaOptions options;
  options.allow_tf32 = c.tf32;
  gemm_cuda(p, stream, options);
  const auto got = dc.host();

  // want = op(A) op(B) (+ bias) (+ C0) in double; tolerance from the sum of
  // magnitudes (fp32 accumulation of k terms; TF32 rounds inputs to 11 bits).
  std::vector<float> got_c;
  std::vector<double> want, tol;
  // TF32 rounds (or truncates) both inputs to 10 mantissa bits first.
  const double input_rounding = c.tf32 ? std::ldexp(1.0, -9) : 0.0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0.0, mag = 0.0;
      for (int64_t l = 0; l < c.k; ++l) {
        const double x = a.values[c.offset + (c.a_t ? l * lda + i : i * lda + l)];
        const double y = b.values[c.offset + (c.b_t ? j * ldb + l : l * ldb + j)];
        sum += x * y;
        mag += std::fabs(x * y);
      }
      if (c.bias) {
        sum += bias[c.offset + j];
        mag += std::fabs(bias[c.offset + j]);
      }
      const float before = c0[c.offset + i * ldc + j];
      if (c.accumulate) {
        sum += before;
        mag += std::fabs(before);
      }
      const float g = got[c.offset + i * ldc + j];
      const double bound = (input_rounding + 2.0 * static_cast<double>(c.k + 2) * 1.2e-7) * mag + 1e-30;
      if (!(std::fabs(g - sum) <= bound)) {
        ADD_FAILURE() << "C[" << i << ", " << j << "]: got " << g << ", want " << sum << " (bound " << bound << ")";
        return got;
      }
    }
  }
  // The padding between rows of C and before it is untouched.
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = c.n; j < ldc; ++j) {
      if (got[c.offset + i * ldc + j] != c0[c.offset + i * ldc + j]) {
        ADD_FAILURE() << "padding C[" << i << ", " << j << "] was written";
        return got;
      }
    }
  }
  return got;
}

TEST_F(GpuGemm, GemmMatchesFloat64ForEveryLayoutAndDtype) {
  const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 48, 96}, {2, 130, 3}};
  const std::pair<DType, DType> dtypes[] = {{DType::kF32, DType::kF32},
                                            {DType::kBF16, DType::kBF16},
                                            {DType::kF32, DType::kBF16},
                                            {DType::kBF16, DType::kF32}};
  int variant = 0;
  for (const auto& s : shapes) {
    for (int t = 0; t < 4; ++t) {
      for (const auto& [ad, bd] : dtypes) {
        for (int extras = 0; extras < 4; ++extras, ++variant) {
          GemmCase c{s[0], s[1], s[2], (t & 1) != 0, (t & 2) != 0, ad, bd, (extras & 1) != 0, (extras & 2) != 0,
                     false, variant % 3 == 0 ? 3 : 0, variant % 5 == 0 ? 1 : 0};
          check_gemm(c, stream_);
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST_F(GpuGemm, GemmWithTf32AndWithoutK) {
  check_gemm(GemmCase{64, 64, 64, false, true, DType::kF32, DType::kF32, true, false, true, 0, 0}, stream_);
  // k = 0: C = bias (or zeros), added to C when accumulating.
  for (int extras = 0; extras < 4; ++extras) {
    check_gemm(GemmCase{5, 9, 0, false, false, DType::kF32, DType::kBF16, (extras & 1) != 0, (extras & 2) != 0, false,
                        2, 0},
               stream_);
  }
}

TEST_F(GpuGemm, GemmRepeatsBitForBit) {
  for (const auto& [ad, bd] : {std::pair{DType::kBF16, DType::kBF16}, std::pair{DType::kF32, DType::kF32}}) {
    const GemmCase c{256, 384, 512, false, true, ad, bd, true, false, false, 0, 0};
    const auto first = check_gemm(c, stream_);
    const auto second = check_gemm(c, stream_);
    expect_same_bits(first, second, "gemm C");
  }
}

// ---- GEMM GELU epilogues ----------------------------------------------------------

// GPT-2's GELU, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3),
// and its derivative 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u'(x), in float64.
double gelu64(double x) {
  const double s = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
double gelu_grad64(double x) {
  const double s = std::sqrt(2.0 / std::numbers::pi), t = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// How far an fp32 GELU epilogue may be from float64. cuBLASLt's fused GELU
// is the tanh form above in its own code, not math::gelu, so its last bits
// may differ from the kernels'; it is held to these bounds, and the kernel
// form to the kernels' bits. With eps = 2^-24, fp32's unit roundoff:
// - The product z = sum_l a_l b_l (+ bias), summed in fp32 in any order, is
//   within e = 2 (k + 2) 2^-23 (sum_l |a_l b_l| + |bias|) of exact
//   (check_gemm's bound).
// - GELU at an fp32 x, in fp32: u(x) takes about 7 roundings (the cube, two
//   scalings, the sum, the two constants), which move the result by at most
//   0.5 |x| sech^2(u) |u| 7 eps <= 1.6 |x| eps (u sech^2 u <= 0.448); a tanh
//   within 2 ulps (CUDA's tanhf) and the rounding of 1 + tanh add
//   1.5 |x| eps, the final product |x| eps: about 4 |x| eps in all, and about
//   as much for math::gelu's x / (1 + exp(-2u)) with its 2-ulp exp. We allow
//   kGeluUlps = 16 times |x| eps, room for any order of those operations. An
//   error e in x moves GELU by at most max |gelu'| e = 1.129 e.
// - GELU' at an exact fp32 x: 1 - tanh^2 cancels, so its error is absolute,
//   about 2 |tanh| 2 eps plus a rounding, times 0.5 |x| u'(x); with the other
//   terms about (2 + 3 |x| u'(x)) eps in all. We allow 16 (1 + |x| u'(x)) eps.
// These assume an fp32 tanh within a few ulps. A tanh from the hardware
// approximation (tanh.approx.f32, about 2^-11 relative) would exceed them
// by far, and the misses reported below would say so by their size.
constexpr double kEps = 0x1p-24;
constexpr double kGeluUlps = 16.0;
constexpr double kMaxGeluSlope = 1.129;  // max |gelu'(x)|, at |x| = 1.42

// The bound on |fp32 GELU(z') - gelu64(z)| for |z' - z| <= e.
double gelu_error_bound(double z, double e) { return kGeluUlps * kEps * (std::fabs(z) + e) + kMaxGeluSlope * e; }

// The bound on |fp32 (c' GELU'(x)) - c gelu_grad64(x)| for |c' - c| <= e.
double dgelu_error_bound(double c, double e, double x) {
  const double s = std::sqrt(2.0 / std::numbers::pi);
  const double d = kGeluUlps * kEps * (1.0 + std::fabs(x) * s * (1.0 + 3.0 * 0.044715 * x * x));
  const double g = std::fabs(gelu_grad64(x)), c_max = std::fabs(c) + e;
  return c_max * d + e * g + kEps * c_max * (g + d);  // the last term: rounding c' GELU'
}

// The float64 product z = A B (+ bias[j] on row j) of row-major A [m, k] and
// B [k, n], and per element the bound e above on an fp32 evaluation's error.
struct Product64 {
  std::vector<double> z, e;
};
Product64 product64(const std::vector<float>& a, const std::vector<float>& b, const float* bias, int64_t m,
                    int64_t k, int64_t n) {
  Product64 r{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = bias != nullptr ? bias[j] : 0.0, mag = std::fabs(sum);
      for (int64_t l = 0; l < k; ++l) {
        sum += static_cast<double>(a[i * k + l]) * b[l * n + j];
        mag += std::fabs(static_cast<double>(a[i * k + l]) * b[l * n + j]);
      }
      r.z[i * n + j] = sum;
      r.e[i * n + j] = 2.0 * static_cast<double>(k + 2) * 1.2e-7 * mag;
    }
  }
  return r;
}

// |got[i] - want[i]| <= bound[i] everywhere; names the first few misses.
void expect_within(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& bound,
                   const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= bound[i]) && ++misses <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (error " << err
                    << ", bound " << bound[i] << ")";
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " elements outside their bound";
}

// The GELU epilogues (GemmCudaOptions::epilogue) of a bf16 product, as
// gemm_cuda picks their form (cuBLASLt's fused epilogue for the forward
// GELU where it has one; for dgelu always the kernel form) and in the
// kernel form (gelu_by_kernel): both within the bounds above of float64;
// the kernel form also bit for bit the plain product followed by the GELU
// kernels, as it runs the plain product's algorithm and the same
// math::gelu / math::gelu_grad. A bias the epilogue cannot read (4-byte
// aligned) always takes the kernel form.
TEST_F(GpuGemm, GemmGeluEpiloguesMatchFloat64AndTheKernelFormMatchesTheKernels) {
  const int64_t m = 50, k = 32, n = 96;
  const auto a = random_floats(m * k, 21), b = random_floats(k * n, 22), bias = random_floats(n + 1, 23),
             g = random_floats(m * n, 24, -2.0f, 2.0f);
  std::vector<bf16> a16(a.size()), b16(b.size());
  std::vector<float> a_values(a.size()), b_values(b.size());  // the bf16 values
  for (size_t i = 0; i < a.size(); ++i) a_values[i] = math::to_f32(a16[i] = math::from_f32<bf16>(a[i]));
  for (size_t i = 0; i < b.size(); ++i) b_values[i] = math::to_f32(b16[i] = math::from_f32<bf16>(b[i]));
  DeviceVector<bf16> da(a16, stream_), db(b16, stream_);
  DeviceVector<float> dbias(bias, stream_), dg(g, stream_);
  // C [m, n] = A B, bf16 in, into `c`.
  auto problem = [&](float* c) {
    GemmProblem p;
    p.m = m;
    p.n = n;
    p.k = k;
    p.a = GemmInput{da.get(), DType::kBF16, k, false};
    p.b = GemmInput{db.get(), DType::kBF16, n, false};
    p.c = c;
    p.ldc = n;
    return p;
  };
  const size_t count = static_cast<size_t>(m * n);
  for (int shift : {0, 1}) {
    SCOPED_TRACE(shift == 0 ? "aligned bias" : "bias the epilogue cannot read");
    DeviceVector<float> plain(count, stream_), want(count, stream_);
    GemmProblem p = problem(plain.get());
    p.bias = dbias.get() + shift;
    gemm_cuda(p, stream_);
    gpt_gelu_forward_cuda(plain.get(), m * n, want.get(), stream_);
    const std::vector<float> plain_h = plain.host(), want_h = want.host();
    const Product64 z = product64(a_values, b_values, bias.data() + shift, m, k, n);
    std::vector<double> gelu_want(count), gelu_bound(count);
    for (size_t i = 0; i < count; ++i) {
      gelu_want[i] = gelu64(z.z[i]);
      gelu_bound[i] = gelu_error_bound(z.z[i], z.e[i]);
    }
    for (bool by_kernel : {false, true}) {
      SCOPED_TRACE(by_kernel ? "gelu_by_kernel" : "the form gemm_cuda picks");
      DeviceVector<float> out(count, stream_), pre(count, stream_);
      p.c = out.get();
      gemm_cuda(p, stream_,
                GemmCudaOptions{.epilogue = GemmEpilogue::kGelu, .aux = pre.get(), .aux_ld = n,
                                .gelu_by_kernel = by_kernel});
      const std::vector<float> out_h = out.host(), pre_h = pre.host();
      expect_within(pre_h, z.z, z.e, "gelu epilogue pre-activation");
      expect_within(out_h, gelu_want, gelu_bound, "gelu epilogue out");
      if (by_kernel || shift == 1) {
        expect_same_bits(pre_h, plain_h, "gelu epilogue pre-activation vs the plain product");
        expect_same_bits(out_h, want_h, "gelu epilogue out vs the plain product then the GELU kernel");
      }
    }
  }
  // dgelu: (A B) gelu'(aux), aux the pre-activation g, no bias.
  DeviceVector<float> plain(count, stream_), want(count, stream_);
  GemmProblem p = problem(plain.get());
  gemm_cuda(p, stream_);
  gpt_gelu_backward_cuda(dg.get(), plain.get(), m * n, want.get(), stream_);
  const std::vector<float> want_h = want.host();
  const Product64 c = product64(a_values, b_values, nullptr, m, k, n);
  std::vector<double> dgelu_want(count), dgelu_bound(count);
  for (size_t i = 0; i < count; ++i) {
    dgelu_want[i] = c.z[i] * gelu_grad64(g[i]);
    dgelu_bound[i] = dgelu_error_bound(c.z[i], c.e[i], g[i]);
  }
  for (bool by_kernel : {false, true}) {
    SCOPED_TRACE(by_kernel ? "gelu_by_kernel" : "the form gemm_cuda picks");
    DeviceVector<float> out(count, stream_);
    p.c = out.get();
    gemm_cuda(p, stream_,
              GemmCudaOptions{.epilogue = GemmEpilogue::kDGelu, .aux = dg.get(), .aux_ld = n,
                              .gelu_by_kernel = by_kernel});
    const std::vector<float> out_h = out.host();
    expect_within(out_h, dgelu_want, dgelu_bound, "dgelu epilogue");
    // Both forms: cuBLASLt's DGELU never runs (GemmEpilogue::kDGelu).
    expect_same_bits(out_h, want_h, "dgelu epilogue vs the plain product then the GELU kernel");
  }
  // Refused: an aux ld that is not a multiple of 8, a bias with dgelu.
  GemmCudaOptions o{.epilogue = GemmEpilogue::kDGelu, .aux = dg.get(), .aux_ld = n + 1};
  EXPECT_THROW(gemm_cuda(p, stream_, o), EnforceError);
  o.aux_ld = n;
  p.bias = dbias.get();
  EXPECT_THROW(gemm_cuda(p, stream_, o), EnforceError);
}

TEST_F(GpuGemm, GemmRejectsBadProblems) {
  DeviceVector<float> buf(64, stream_);
  GemmProblem p;
  p.m = p.n = p.k = 4;
  p.a = GemmInput{buf.get(), DType::kF32, 3, false};  // ld < k
  p.b = GemmInput{buf.get(), DType::kF32, 4, false};
  p.c = buf.get() + 32;
  p.ldc = 4;
  EXPECT_THROW(gemm_cuda(p, stream_), EnforceError);
  p.a = GemmInput{buf.get(), DType::kF16, 4, false};
  EXPECT_THROW(gemm_cuda(p, stream_), EnforceError);
  p.a = GemmInput{buf.get(), DType::kF32, 4, false};
  p.ldc = 3;
  EXPECT_THROW(gemm_cuda(p, stream_), EnforceError);
  EXPECT_FALSE(gemm_cuda_describe().empty());
}

TEST_F(GpuGemm, GemmCudaCachesOnePlanPerShapeAndAlignmentClass) {
  DeviceVector<float> a(random_floats(64 * 64, 1), stream_), b(random_floats(64 * 64, 2), stream_),
      c(64 * 64, stream_);
  GemmCuda gemm(0);
  GemmProblem p;
  p.m = 8;
  p.n = 16;
  p.k = 32;
  p.a = GemmInput{a.get(), DType::kF32, 32, false};
  p.b = GemmInput{b.get(), DType::kF32, 16, false};
  p.c = c.get();
  p.ldc = 16;
  gemm.run(p, stream_);
  gemm.run(p, stream_);
  EXPECT_EQ(gemm.cached_plans(), 1);
  p.b.transposed = true;
  p.b.ld = 32;
  gemm.run(p, stream_);
  EXPECT_EQ(gemm.cached_plans(), 2);
  // A less aligned A (4 bytes past a 256-byte boundary) is another alignment
  // class, so another plan; another pointer of that class is not.
  p.a.data = a.get() + 1;
  gemm.run(p, stream_);
  EXPECT_EQ(gemm.cached_plans(), 3);
  p.a.data = a.get() + 3;
  gemm.run(p, stream_);
  EXPECT_EQ(gemm.cached_plans(), 3);
  // So is a bias, and a less aligned one.
  DeviceVector<float> bias(random_floats(17, 3), stream_);
  p.bias = bias.get();
  gemm.run(p, stream_);
  EXPECT_EQ(gemm.cached_plans(), 4);
  p.bias = bias.get() + 1;
  gemm.run(p, stream_);
  EXPECT_EQ(gemm.cached_plans(), 5);
  testing::wait_for_stream(stream_);
}

}  // namespace
}  // namespace mp

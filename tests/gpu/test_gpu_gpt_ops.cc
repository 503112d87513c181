// GPU tests (label "gpu"): the cuBLASLt GEMM (kernels/cuda/gemm_cublaslt.h)
// against a float64 product of the same (bf16-rounded) values for every
// layout, dtype pair, bias and accumulate, its GELU epilogues against
// float64 and, in their kernel form, against the GELU kernels bit for bit,
// and its plan per alignment class; and each GPT CUDA kernel
// (kernels/cuda/gpt_ops_cuda.h) against the double instantiation of the CPU
// op (kernels/cpu/gpt_ops.h) on tiny awkward shapes, within fp32 rounding. Every
// deterministic kernel runs twice and must give the same bits.
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
#include "tests/gpu/gpu_test.h"

namespace mp {
namespace {

// Device copy of a host vector (at least one element, so never null),
// uploaded on the test's stream; host() downloads it on that stream, after
// the work enqueued there before (testing::copy_on_stream).
template <class T>
class DeviceVector {
 public:
  DeviceVector(const std::vector<T>& host, cudaStream_t stream) : n_(host.size()), stream_(stream) {
    MP_CHECK_CUDA(cudaMalloc(&p_, std::max<size_t>(n_, 1) * sizeof(T)));
    testing::copy_on_stream(p_, host.data(), n_ * sizeof(T), stream_);
  }
  DeviceVector(size_t n, cudaStream_t stream) : DeviceVector(std::vector<T>(n), stream) {}
  ~DeviceVector() { cudaFree(p_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  T* get() const { return static_cast<T*>(p_); }
  std::vector<T> host() const {
    std::vector<T> out(n_);
    testing::copy_on_stream(out.data(), p_, n_ * sizeof(T), stream_);
    return out;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
  cudaStream_t stream_;
};

class GpuOps : public testing::GpuStreamTest {};

std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// |got - want| <= atol + rtol |want| everywhere; names the first few misses.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rtol, double atol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i])) && ++misses <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (error " << err << ")";
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " elements outside tolerance";
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i] << " (not bitwise equal)";
      return;
    }
  }
}

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

TEST_F(GpuOps, GemmMatchesFloat64ForEveryLayoutAndDtype) {
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

TEST_F(GpuOps, GemmWithTf32AndWithoutK) {
  check_gemm(GemmCase{64, 64, 64, false, true, DType::kF32, DType::kF32, true, false, true, 0, 0}, stream_);
  // k = 0: C = bias (or zeros), added to C when accumulating.
  for (int extras = 0; extras < 4; ++extras) {
    check_gemm(GemmCase{5, 9, 0, false, false, DType::kF32, DType::kBF16, (extras & 1) != 0, (extras & 2) != 0, false,
                        2, 0},
               stream_);
  }
}

TEST_F(GpuOps, GemmRepeatsBitForBit) {
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
// gemm_cuda picks their form (cuBLASLt's fused epilogue where it has one)
// and in the kernel form (gelu_by_kernel): both within the bounds above of
// float64; the kernel form also bit for bit the plain product followed by
// the GELU kernels, as it runs the plain product's algorithm and the same
// math::gelu / math::gelu_grad. A bias the epilogue cannot read (4-byte
// aligned) always takes the kernel form.
TEST_F(GpuOps, GemmGeluEpiloguesMatchFloat64AndTheKernelFormMatchesTheKernels) {
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
    if (by_kernel) expect_same_bits(out_h, want_h, "dgelu epilogue vs the plain product then the GELU kernel");
  }
  // Refused: an aux ld that is not a multiple of 8, a bias with dgelu.
  GemmCudaOptions o{.epilogue = GemmEpilogue::kDGelu, .aux = dg.get(), .aux_ld = n + 1};
  EXPECT_THROW(gemm_cuda(p, stream_, o), EnforceError);
  o.aux_ld = n;
  p.bias = dbias.get();
  EXPECT_THROW(gemm_cuda(p, stream_, o), EnforceError);
}

TEST_F(GpuOps, GemmRejectsBadProblems) {
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

TEST_F(GpuOps, GemmCudaCachesOnePlanPerShapeAndAlignmentClass) {
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
  MP_CHECK_CUDA(cudaStreamSynchronize(stream_));
}

// ---- embedding ------------------------------------------------------------------

TEST_F(GpuOps, EmbeddingMatchesCpuAndRepeats) {
  const int64_t batch = 3, seq = 5, channels = 37, vocab_rows = 11, rows = batch * seq;
  std::vector<int32_t> tokens(rows);
  std::mt19937 rng(5);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 4 == 0 ? 7 : rng() % vocab_rows);  // repeats
  const auto wte = random_floats(vocab_rows * channels, 1), wpe = random_floats(seq * channels, 2);
  DeviceVector<int32_t> dtok(tokens, stream_);
  DeviceVector<float> dwte(wte, stream_), dwpe(wpe, stream_), dout_f(rows * channels, stream_);
  gpt_embedding_forward_cuda(dtok.get(), dwte.get(), dwpe.get(), batch, seq, channels, vocab_rows, dout_f.get(),
                             stream_);
  std::vector<double> want(rows * channels);
  const auto wte_d = to_double(wte), wpe_d = to_double(wpe);
  gpt_embedding_forward(tokens.data(), wte_d.data(), wpe_d.data(), batch, seq, channels, vocab_rows, want.data(), 1);
  expect_close(dout_f.host(), want, 1e-7, 0.0, "embedding out");

  // Backward accumulates: into random tables, compared with the double op and
  // with the float op bit for bit (the same additions in the same order).
  const auto g = random_floats(rows * channels, 3), gwte0 = random_floats(vocab_rows * channels, 4),
             gwpe0 = random_floats(seq * channels, 5);
  auto want_wte = to_double(gwte0), want_wpe = to_double(gwpe0);
  const auto g_d = to_double(g);
  gpt_embedding_backward(tokens.data(), g_d.data(), batch, seq, channels, want_wte.data(), want_wpe.data(), 1);
  auto cpu_wte = gwte0, cpu_wpe = gwpe0;
  gpt_embedding_backward(tokens.data(), g.data(), batch, seq, channels, cpu_wte.data(), cpu_wpe.data(), 1);
  const int64_t ws_bytes = gpt_embedding_backward_cuda_workspace_bytes(rows, vocab_rows);
  DeviceVector<uint8_t> ws(static_cast<size_t>(ws_bytes), stream_);
  DeviceVector<float> dg(g, stream_);
  std::vector<float> runs[2][2];
  for (auto& run : runs) {
    DeviceVector<float> gwte(gwte0, stream_), gwpe(gwpe0, stream_);
    gpt_embedding_backward_cuda(dtok.get(), dg.get(), batch, seq, channels, vocab_rows, gwte.get(), gwpe.get(),
                                ws.get(), ws_bytes, stream_);
    run[0] = gwte.host();
    run[1] = gwpe.host();
  }
  expect_close(runs[0][0], want_wte, 1e-5, 1e-5, "dwte");
  expect_close(runs[0][1], want_wpe, 1e-5, 1e-5, "dwpe");
  expect_same_bits(runs[0][0], cpu_wte, "dwte vs the float CPU op");
  expect_same_bits(runs[0][1], cpu_wpe, "dwpe vs the float CPU op");
  expect_same_bits(runs[0][0], runs[1][0], "dwte run twice");

  // An id outside [0, vocab_rows): NaN in its forward row, skipped backward.
  tokens[4] = static_cast<int32_t>(vocab_rows);
  DeviceVector<int32_t> bad(tokens, stream_);
  gpt_embedding_forward_cuda(bad.get(), dwte.get(), dwpe.get(), batch, seq, channels, vocab_rows, dout_f.get(),
                             stream_);
  const auto out = dout_f.host();
  EXPECT_TRUE(std::isnan(out[4 * channels])) << out[4 * channels];
  EXPECT_FALSE(std::isnan(out[3 * channels]));
  DeviceVector<float> gwte(gwte0, stream_), gwpe(gwpe0, stream_);
  gpt_embedding_backward_cuda(bad.get(), dg.get(), batch, seq, channels, vocab_rows, gwte.get(), gwpe.get(), ws.get(),
                              ws_bytes, stream_);
  // The CPU op with row 4's gradient zeroed (x + 0 == x) under a valid token.
  auto g_skip = g;
  std::fill(g_skip.begin() + 4 * channels, g_skip.begin() + 5 * channels, 0.0f);
  auto tokens_skip = tokens;
  tokens_skip[4] = 0;
  auto skip_wte = gwte0, skip_wpe = gwpe0;
  gpt_embedding_backward(tokens_skip.data(), g_skip.data(), batch, seq, channels, skip_wte.data(), skip_wpe.data(), 1);
  expect_same_bits(gwte.host(), skip_wte, "dwte with an invalid token");
}

// ---- layernorm and bias -------------------------------------------------------------

TEST_F(GpuOps, LayerNormMatchesCpuAndRepeats) {
  for (const auto& [rows, channels] : {std::pair<int64_t, int64_t>{6, 37}, {200, 130}, {1, 1}}) {
    SCOPED_TRACE(detail::str(rows, " rows x ", channels, " channels"));
    const auto x = random_floats(rows * channels, 1, -2.0f, 3.0f), w = random_floats(channels, 2),
               b = random_floats(channels, 3), g = random_floats(rows * channels, 4),
               dx0 = random_floats(rows * channels, 5);
    const auto x_d = to_double(x), w_d = to_double(w), b_d = to_double(b), g_d = to_double(g);
    std::vector<double> out(rows * channels), mean(rows), rstd(rows), dx = to_double(dx0), dw(channels), db(channels);
    gpt_layernorm_forward(x_d.data(), w_d.data(), b_d.data(), rows, channels, out.data(), mean.data(), rstd.data(), 1);
    gpt_layernorm_backward(g_d.data(), x_d.data(), w_d.data(), mean.data(), rstd.data(), rows, channels, dx.data(),
                           dw.data(), db.data(), 1);

    const int64_t ws_bytes = gpt_layernorm_backward_cuda_workspace_bytes(rows, channels);
    DeviceVector<float> dxin(x, stream_), dwt(w, stream_), dbt(b, stream_), dg(g, stream_),
        dws(static_cast<size_t>(ws_bytes / 4), stream_);
    std::vector<float> runs[2][6];
    for (auto& run : runs) {
      DeviceVector<float> o(rows * channels, stream_), m(rows, stream_), r(rows, stream_), ddx(dx0, stream_),
          ddw(channels, stream_), ddb(channels, stream_);
      gpt_layernorm_forward_cuda(dxin.get(), dwt.get(), dbt.get(), rows, channels, o.get(), m.get(), r.get(), stream_);
      gpt_layernorm_backward_cuda(dg.get(), dxin.get(), dwt.get(), m.get(), r.get(), rows, channels, ddx.get(),
                                  ddw.get(), ddb.get(), dws.get(), stream_);
      run[0] = o.host();
      run[1] = m.host();
      run[2] = r.host();
      run[3] = ddx.host();
      run[4] = ddw.host();
      run[5] = ddb.host();
    }
    expect_close(runs[0][0], out, 1e-5, 1e-5, "layernorm out");
    expect_close(runs[0][1], mean, 1e-5, 1e-6, "layernorm mean");
    expect_close(runs[0][2], rstd, 1e-5, 1e-6, "layernorm rstd");
    expect_close(runs[0][3], dx, 1e-4, 1e-5, "layernorm dx");
    expect_close(runs[0][4], dw, 1e-4, 1e-4, "layernorm dw");
    expect_close(runs[0][5], db, 1e-4, 1e-4, "layernorm db");
    for (int i = 0; i < 6; ++i) expect_same_bits(runs[0][i], runs[1][i], "layernorm run twice");
  }
}

// The fused residual add + layernorm gives the bits of the two kernels, in
// place too (sum over b, as the CUDA GPT runs it).
TEST_F(GpuOps, AddLayerNormGivesTheBitsOfAddThenLayerNorm) {
  for (const auto& [rows, channels] : {std::pair<int64_t, int64_t>{6, 37}, {200, 768}, {1, 1}}) {
    SCOPED_TRACE(detail::str(rows, " rows x ", channels, " channels"));
    const auto a = random_floats(rows * channels, 11, -2.0f, 3.0f), b = random_floats(rows * channels, 12),
               w = random_floats(channels, 13), bias = random_floats(channels, 14);
    DeviceVector<float> da(a, stream_), dw(w, stream_), dbias(bias, stream_);
    // Unfused: sum = a + b in place.
    DeviceVector<float> sum(b, stream_), o1(rows * channels, stream_), m1(rows, stream_), r1(rows, stream_);
    gpt_add_cuda(da.get(), sum.get(), rows * channels, sum.get(), stream_);
    gpt_layernorm_forward_cuda(sum.get(), dw.get(), dbias.get(), rows, channels, o1.get(), m1.get(), r1.get(), stream_);
    DeviceVector<float> fused(b, stream_), o2(rows * channels, stream_), m2(rows, stream_), r2(rows, stream_);
    gpt_add_layernorm_forward_cuda(da.get(), fused.get(), dw.get(), dbias.get(), rows, channels, fused.get(), o2.get(),
                                   m2.get(), r2.get(), stream_);
    expect_same_bits(fused.host(), sum.host(), "sum");
    expect_same_bits(o2.host(), o1.host(), "out");
    expect_same_bits(m2.host(), m1.host(), "mean");
    expect_same_bits(r2.host(), r1.host(), "rstd");
  }
}

TEST_F(GpuOps, BiasBackwardMatchesCpuAndRepeats) {
  for (const auto& [rows, out] : {std::pair<int64_t, int64_t>{200, 45}, {3, 300}, {0, 5}}) {
    const auto dy = random_floats(std::max<int64_t>(rows * out, 0), 7);
    const auto dy_d = to_double(dy);
    // Column sums in double, written plainly.
    std::vector<double> want(out, 0.0);
    for (int64_t n = 0; n < rows; ++n) {
      for (int64_t o = 0; o < out; ++o) want[o] += dy_d[n * out + o];
    }
    DeviceVector<float> ddy(dy, stream_),
        ws(static_cast<size_t>(gpt_bias_backward_cuda_workspace_bytes(rows, out) / 4), stream_);
    std::vector<float> runs[2];
    for (auto& run : runs) {
      DeviceVector<float> db(random_floats(out, 8), stream_);  // overwritten
      gpt_bias_backward_cuda(ddy.get(), rows, out, db.get(), ws.get(), stream_);
      run = db.host();
    }
    expect_close(runs[0], want, 1e-4, 1e-4, "bias db");
    expect_same_bits(runs[0], runs[1], "bias db run twice");
  }
}

// ---- gelu, add, bf16 rounding ------------------------------------------------------

TEST_F(GpuOps, GeluAddAndBf16RoundingMatchCpu) {
  const int64_t n = 1001;
  const auto x = random_floats(n, 1, -5.0f, 5.0f), g = random_floats(n, 2);
  const auto x_d = to_double(x), g_d = to_double(g);
  std::vector<double> y(n), dx(n);
  gpt_gelu_forward(x_d.data(), n, y.data(), 1);
  gpt_gelu_backward(x_d.data(), g_d.data(), n, dx.data(), 1);
  DeviceVector<float> dxin(x, stream_), dy(n, stream_), dg(g, stream_);
  gpt_gelu_forward_cuda(dxin.get(), n, dy.get(), stream_);
  expect_close(dy.host(), y, 1e-5, 1e-6, "gelu");
  gpt_gelu_backward_cuda(dxin.get(), dg.get(), n, dg.get(), stream_);  // in place over dout
  // 1 - tanh^2 cancels for |x| of a few units: absolute error ~1e-6 there.
  expect_close(dg.host(), dx, 1e-5, 2e-5, "gelu backward");

  DeviceVector<float> a(x, stream_), b(g, stream_);
  gpt_add_cuda(a.get(), b.get(), n, a.get(), stream_);
  std::vector<double> sum(n);
  for (int64_t i = 0; i < n; ++i) sum[i] = static_cast<double>(x[i] + g[i]);  // one fp32 rounding
  expect_close(a.host(), sum, 0.0, 0.0, "add");

  DeviceVector<uint16_t> as_bf16(n, stream_);
  DeviceVector<float> as_f32(n, stream_);
  gpt_round_to_bf16_cuda(dxin.get(), n, DType::kBF16, as_bf16.get(), stream_);
  gpt_round_to_bf16_cuda(dxin.get(), n, DType::kF32, as_f32.get(), stream_);
  const auto h16 = as_bf16.host();
  const auto h32 = as_f32.host();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(h16[i], math::f32_to_bf16_bits(x[i])) << i;
    ASSERT_EQ(h32[i], math::bf16_bits_to_f32(math::f32_to_bf16_bits(x[i]))) << i;
  }
}

// ---- attention ----------------------------------------------------------------------

TEST_F(GpuOps, AttentionMatchesCpuAndRepeats) {
  struct Shape {
    int64_t batch, seq, channels, heads;
  };
  for (const Shape s : {Shape{2, 9, 12, 3}, Shape{1, 130, 16, 2}, Shape{1, 1, 4, 4}}) {
    SCOPED_TRACE(detail::str("batch ", s.batch, " seq ", s.seq, " channels ", s.channels, " heads ", s.heads));
    const int64_t rows = s.batch * s.seq, att_n = s.batch * s.heads * s.seq * s.seq;
    const auto qkv = random_floats(rows * 3 * s.channels, 1, -2.0f, 2.0f), g = random_floats(rows * s.channels, 2);
    const auto qkv_d = to_double(qkv), g_d = to_double(g);
    std::vector<double> att(att_n), out(rows * s.channels), dqkv(rows * 3 * s.channels),
        scratch(s.batch * s.heads * s.seq);
    gpt_attention_forward(qkv_d.data(), s.batch, s.seq, s.channels, s.heads, att.data(), out.data(), 1);
    gpt_attention_backward(qkv_d.data(), att.data(), g_d.data(), s.batch, s.seq, s.channels, s.heads, scratch.data(),
                           dqkv.data(), 1);

    DeviceVector<float> dq(qkv, stream_), dg(g, stream_),
        dscratch(gpt_attention_backward_cuda_scratch_elements(s.batch, s.seq, s.heads), stream_);
    std::vector<float> runs[2][3];
    for (auto& run : runs) {
      DeviceVector<float> datt(random_floats(att_n, 3), stream_), dout(rows * s.channels, stream_),
          ddqkv(random_floats(rows * 3 * s.channels, 4), stream_);  // all overwritten
      gpt_attention_forward_cuda(dq.get(), s.batch, s.seq, s.channels, s.heads, datt.get(), dout.get(), stream_);
      gpt_attention_backward_cuda(dq.get(), datt.get(), dg.get(), s.batch, s.seq, s.channels, s.heads, dscratch.get(),
                                  ddqkv.get(), stream_);
      run[0] = datt.host();
      run[1] = dout.host();
      run[2] = ddqkv.host();
    }
    expect_close(runs[0][0], att, 1e-4, 1e-6, "att");
    expect_close(runs[0][1], out, 1e-4, 1e-5, "attention out");
    expect_close(runs[0][2], dqkv, 1e-4, 1e-5, "dqkv");
    for (int i = 0; i < 3; ++i) expect_same_bits(runs[0][i], runs[1][i], "attention run twice");
  }
}

// ---- loss ---------------------------------------------------------------------------

TEST_F(GpuOps, SoftmaxCrossEntropyMatchesCpuAndRepeats) {
  for (const auto& [rows, vocab, padded] : {std::tuple<int64_t, int64_t, int64_t>{7, 50, 64}, {3, 1000, 1000}}) {
    SCOPED_TRACE(detail::str(rows, " rows, vocab ", vocab, ", padded ", padded));
    const auto logits = random_floats(rows * padded, 1, -8.0f, 8.0f);
    std::vector<int32_t> targets(rows);
    for (int64_t n = 0; n < rows; ++n) targets[n] = static_cast<int32_t>((n * 13 + 5) % vocab);
    const auto logits_d = to_double(logits);
    std::vector<double> row_loss(rows), dlogits(rows * padded);
    const double mean = gpt_softmax_xent(logits_d.data(), targets.data(), rows, vocab, padded, row_loss.data(),
                                         dlogits.data(), 1);
    DeviceVector<float> dz(logits, stream_);
    DeviceVector<int32_t> dt(targets, stream_);
    std::vector<float> runs[2][2];
    double means[2];
    for (int r = 0; r < 2; ++r) {
      DeviceVector<float> loss(rows, stream_), grad(random_floats(rows * padded, 2), stream_);  // padding must become 0
      DeviceVector<double> dmean(1, stream_);
      gpt_softmax_xent_cuda(dz.get(), dt.get(), rows, vocab, padded, loss.get(), grad.get(), dmean.get(), stream_);
      runs[r][0] = loss.host();
      runs[r][1] = grad.host();
      means[r] = dmean.host()[0];
    }
    expect_close(runs[0][0], row_loss, 1e-5, 1e-6, "row loss");
    expect_close(runs[0][1], dlogits, 1e-5, 1e-7, "dlogits");
    for (int64_t n = 0; n < rows; ++n) {
      for (int64_t c = vocab; c < padded; ++c) ASSERT_EQ(runs[0][1][n * padded + c], 0.0f) << n << ", " << c;
    }
    EXPECT_NEAR(means[0], mean, 1e-5 * std::fabs(mean));
    for (int i = 0; i < 2; ++i) expect_same_bits(runs[0][i], runs[1][i], "cross-entropy run twice");
    EXPECT_EQ(std::memcmp(&means[0], &means[1], sizeof(double)), 0) << "mean loss run twice";

    // A target outside [0, vocab): that row's loss and gradient are NaN.
    targets[0] = static_cast<int32_t>(vocab);
    DeviceVector<int32_t> bad(targets, stream_);
    DeviceVector<float> loss(rows, stream_), grad(rows * padded, stream_);
    gpt_softmax_xent_cuda(dz.get(), bad.get(), rows, vocab, padded, loss.get(), grad.get(), nullptr, stream_);
    const auto l = loss.host();
    EXPECT_TRUE(std::isnan(l[0]));
    EXPECT_FALSE(std::isnan(l[1]));
    EXPECT_TRUE(std::isnan(grad.host()[0]));
  }
}

// gpt_ops_cuda.cu keeps its own copy of the constant (kernels/ sits below models/).
static_assert(kGptLayerNormEps == 1e-5, "update kLayerNormEps in kernels/cuda/gpt_ops_cuda.cu");

}  // namespace
}  // namespace mp

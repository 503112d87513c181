// GPU tests (label "gpu"): the cuBLASLt GEMM (kernels/cuda/gemm_cublaslt.h)
// against a float64 product of the same (bf16-rounded) values for every
// layout, dtype pair, bias and accumulate, its epilogues (bf16 outputs,
// bias, residual addend, GELU, its gradient, the bias gradient) against the
// CPU GEMM on the same inputs in the form it picks and in the kernel form,
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
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/gemm_cublaslt.h"
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

// ---- the epilogue ------------------------------------------------------------------

// One GPT-shaped problem of each kind the model runs (Note [GEMM epilogue]),
// on the GPU in the form gemm_cuda picks and in the kernel form
// (epilogue_by_kernel), against gemm_cpu on the same inputs: both round at
// the same points, so they differ by the fp32 accumulation of each (k 2^-23
// of the magnitudes, twice) and, for a bf16 output, one bf16 rounding
// (2^-8 relative) of slightly different values; through the GELU and its
// gradient (slopes below 1.13 and 1.2) a few times that. The GPU result
// repeats bit for bit.
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

struct EpilogueCase {
  const char* name;
  int64_t m, n, k;
  DType out;
  bool bias, addend, b_transposed, bias_grad;
  GemmEpilogue epilogue;
};

TEST_F(GpuGemm, EpilogueMatchesTheCpuBodyInEveryForm) {
  const EpilogueCase cases[] = {
      {"c_attn forward", 96, 144, 64, DType::kBF16, true, false, false, false, GemmEpilogue::kNone},
      {"c_proj forward + residual", 96, 48, 64, DType::kF32, true, true, false, false, GemmEpilogue::kNone},
      {"c_fc forward + gelu", 96, 256, 64, DType::kBF16, true, false, false, false, GemmEpilogue::kGelu},
      {"mlp.c_proj backward (d fch)", 96, 256, 64, DType::kBF16, false, false, true, false, GemmEpilogue::kDGelu},
      {"mlp.c_proj backward (d fch), fp32", 96, 256, 64, DType::kF32, false, false, true, false, GemmEpilogue::kDGelu},
      {"d weight + d bias", 64, 144, 96, DType::kF32, false, false, false, true, GemmEpilogue::kNone},
  };
  for (const EpilogueCase& c : cases) {
    SCOPED_TRACE(c.name);
    // A [m, k] (for the weight gradient: x^T, stored [k, m]), B [k, n] or [n, k].
    const bool a_t = c.bias_grad;
    const auto a = random_floats(c.m * c.k, 31), b = random_floats(c.k * c.n, 32), bias = random_floats(c.n, 33),
               addend = random_floats(c.m * c.n, 34), pre = random_floats(c.m * c.n, 35, -3.0f, 3.0f);
    std::vector<bf16> a16, b16, pre16;
    for (float x : a) a16.push_back(math::from_f32<bf16>(x));
    for (float x : b) b16.push_back(math::from_f32<bf16>(x));
    for (float x : pre) pre16.push_back(math::from_f32<bf16>(x));
    const size_t count = static_cast<size_t>(c.m * c.n);
    const bool out16 = c.out == DType::kBF16;
    auto make = [&](const void* da, const void* db, const float* dbias, const float* dadd, void* dc, void* daux,
                    float* dgrad) {
      GemmProblem p = gemm_problem(c.m, c.n, c.k, GemmInput{da, DType::kBF16, a_t ? c.m : c.k, a_t},
                                   GemmInput{db, DType::kBF16, c.b_transposed ? c.k : c.n, c.b_transposed}, dc, c.out,
                                   out16, c.bias ? dbias : nullptr);
      p.addend = c.addend ? dadd : nullptr;
      p.epilogue = c.epilogue;
      p.aux = c.epilogue != GemmEpilogue::kNone ? daux : nullptr;
      p.aux_ld = c.n;
      p.bias_grad = c.bias_grad ? dgrad : nullptr;
      return p;
    };
    // The CPU body.
    std::vector<float> c32(count), aux32(count), grad(static_cast<size_t>(c.n));
    std::vector<bf16> c16(count), aux16 = pre16;
    if (!out16 && c.epilogue == GemmEpilogue::kDGelu) {
      for (size_t i = 0; i < count; ++i) aux32[i] = math::to_f32(pre16[i]);
    }
    gemm_cpu(make(a16.data(), b16.data(), bias.data(), addend.data(), out16 ? static_cast<void*>(c16.data()) : c32.data(),
                  out16 ? static_cast<void*>(aux16.data()) : aux32.data(), grad.data()));
    std::vector<double> want(count), want_aux(count);
    for (size_t i = 0; i < count; ++i) {
      want[i] = out16 ? math::to_f32(c16[i]) : c32[i];
      want_aux[i] = out16 ? math::to_f32(aux16[i]) : aux32[i];
    }
    // The bound, from the magnitudes of the products.
    std::vector<double> bound(count);
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double mag = (c.bias ? std::fabs(bias[j]) : 0.0) + (c.addend ? std::fabs(addend[i * c.n + j]) : 0.0);
        for (int64_t l = 0; l < c.k; ++l) {
          const double x = math::to_f32(a16[a_t ? l * c.m + i : i * c.k + l]);
          const double y = math::to_f32(b16[c.b_transposed ? j * c.k + l : l * c.n + j]);
          mag += std::fabs(x * y);
        }
        const size_t idx = static_cast<size_t>(i * c.n + j);
        bound[idx] = 4.0 * (2.0 * static_cast<double>(c.k + 2) * 1.2e-7 * mag) + (out16 ? 2.0 / 256 : 1e-6) * std::fabs(want[idx]) + 1e-6;
      }
    }
    DeviceVector<bf16> da(a16, stream_), db(b16, stream_);
    DeviceVector<float> dbias(bias, stream_), dadd(addend, stream_);
    for (bool by_kernel : {false, true}) {
      SCOPED_TRACE(by_kernel ? "the kernel form" : "the form gemm_cuda picks");
      std::vector<float> runs[2];
      for (auto& run : runs) {
        DeviceVector<float> dc32(random_floats(count, 36), stream_), daux32(aux32, stream_),
            dgrad(random_floats(static_cast<size_t>(c.n), 37), stream_);
        DeviceVector<bf16> dc16(count, stream_), daux16(pre16, stream_);
        gemm_cuda(make(da.get(), db.get(), dbias.get(), dadd.get(), out16 ? static_cast<void*>(dc16.get()) : dc32.get(),
                       out16 ? static_cast<void*>(daux16.get()) : daux32.get(), dgrad.get()),
                  stream_, GemmCudaOptions{.epilogue_by_kernel = by_kernel});
        run.clear();
        if (out16) {
          for (bf16 h : dc16.host()) run.push_back(math::to_f32(h));
          if (c.epilogue == GemmEpilogue::kGelu) {
            std::vector<float> aux;
            for (bf16 h : daux16.host()) aux.push_back(math::to_f32(h));
            std::vector<double> aux_bound(count);
            for (size_t i = 0; i < count; ++i) aux_bound[i] = bound[i];
            expect_within(aux, want_aux, aux_bound, "the saved pre-activation");
          }
        } else {
          run = dc32.host();
        }
        if (c.bias_grad) {
          std::vector<double> gw(grad.begin(), grad.end()), gb(grad.size());
          for (size_t j = 0; j < gb.size(); ++j) gb[j] = 1e-5 * static_cast<double>(c.k) + 1e-5 * std::fabs(gw[j]);
          expect_within(dgrad.host(), gw, gb, "the bias gradient");
        }
      }
      expect_within(runs[0], want, bound, "C");
      expect_same_bits(runs[0], runs[1], "C run twice");
      if (!out16) {
        // The same math as the CPU's on fp32 products that differ only in
        // their accumulation order: about 1e-7 relative over the matrix
        // (cuBLASLt's own DGELU was 5e-5 off: it must not be what runs).
        double err = 0, norm = 0;
        for (size_t i = 0; i < count; ++i) {
          err += (runs[0][i] - want[i]) * (runs[0][i] - want[i]);
          norm += want[i] * want[i];
        }
        EXPECT_LT(std::sqrt(err / norm), 2e-6) << "C relative to the CPU's, over the matrix";
      }
    }
  }
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
  (void)gemm_cuda_new_plans();
  p.bias = bias.get() + 1;
  gemm.run(p, stream_);
  EXPECT_EQ(gemm.cached_plans(), 5);
  // A bias 4 bytes past 16-byte alignment never reaches cuBLASLt's epilogue.
  const std::vector<GemmPlanReport> plans = gemm_cuda_new_plans();
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(plans[0].form, "product, then kernels");
  testing::wait_for_stream(stream_);
}

}  // namespace
}  // namespace mp

// GPU tests (label "gpu") of the cuDNN attention (kernels/cuda/attention_cudnn.h):
// forward and backward against the float64 CPU attention
// (gpt_attention_forward / _backward<double>, kernels/cpu/attention.h) on the
// same bf16 inputs widened, within a tolerance derived for bf16 below; every
// output poisoned before each call; two runs give the same bits; a shape
// cuDNN refuses is refused before anything runs, with the shape and reason.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention_cudnn.h"
#include "tests/gpt_test_ops.h"
#include "tests/gpu/gpu_data.h"
#include "tests/gpu/gpu_test.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using namespace mp::testing;  // NOLINT(build/namespaces): the shared test data helpers

class CudnnAttention : public testing::GpuStreamTest {};

// Note [cuDNN attention tolerance]
// The inputs are bf16 values, widened exactly for the float64 reference, so
// every difference comes from cuDNN's roundings. With u = 2^-8 (bf16's unit
// roundoff) and fp32 work inside cuDNN (errors ~1e-6, negligible here):
// - out[t] = sum_j p_tj v_j: the probabilities p are rounded to bf16 before
//   the product with v (relative error <= u each) and out is rounded to bf16
//   (<= u |out| <= u sum_j p_tj |v_j|): |error| <= 2 u M_out with
//   M_out[t, d] = sum_j p_tj |v_jd|.
// - dv[j] = sum_t p_tj dout_t: p in bf16 and dv rounded: 2 u M_dv,
//   M_dv[j, d] = sum_t p_tj |dout_td|.
// - dq[t] = s sum_j ds_tj k_j and dk[j] = s sum_t ds_tj q_t (s = 1/sqrt(hs)),
//   ds_tj = p_tj (dp_tj - D_t), dp_tj = dout_t . v_j, D_t = dout_t . out_t:
//   cuDNN takes D from the bf16 out (error <= u sum_d |dout_td out_td| =: u A_t),
//   rounds ds to bf16 (u |ds|) and the result (u): with
//   G_tj = p_tj (|dp_tj| + A_t), |error| <= 3 u M with M_dq[t, d] =
//   s sum_j G_tj |k_jd| and M_dk[j, d] = s sum_t G_tj |q_td|.
// Each element must lie within 2x its bound (the factor covers fp32's share
// and the exp), plus 1e-6 absolute for elements whose bound is 0 (t = 0 rows
// of dq: D_0 = dp_00 exactly). The whole tensors' relative errors are then
// of order 1e-2 at most, which is also checked: ||got - want|| <= 2e-2 ||want||.
// Stats are fp32: |lse - want| <= 1e-4 (1 + |want|).
constexpr double kU = 1.0 / 256;

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = math::f32_to_bf16_bits(v[i]);
  return out;
}
std::vector<double> widen(const std::vector<uint16_t>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = math::bf16_bits_to_f32(v[i]);
  return out;
}

// got (bf16 bits) within factor * bound + 1e-6 of want, element by element,
// and ||got - want|| <= 2e-2 ||want||; names the first few misses.
void expect_within(const std::vector<uint16_t>& got, const std::vector<double>& want, const std::vector<double>& bound,
                   double factor, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  double err2 = 0, want2 = 0, worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = math::bf16_bits_to_f32(got[i]), err = std::fabs(g - want[i]);
    const double allowed = factor * bound[i] + 1e-6;
    if (!(err <= allowed) && ++misses <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << g << ", want " << want[i] << " (error " << err << ", allowed "
                    << allowed << ")";
    }
    err2 += err * err;
    want2 += want[i] * want[i];
    if (bound[i] > 0) worst = std::max(worst, err / (factor * bound[i]));
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " elements outside tolerance";
  EXPECT_LE(std::sqrt(err2), 2e-2 * std::sqrt(want2)) << what << ": relative error of the whole tensor";
  ::testing::Test::RecordProperty(what, sci(worst));
}

struct Case {
  SdpaShape shape;
  bool must_be_supported;  // else a refusal is reported, not failed
};

// Device buffers of one shape (bf16 as its bits).
struct Buffers {
  Buffers(const SdpaShape& s, cudaStream_t stream)
      : n_qkv(s.batch * s.seq * 3 * s.channels()),
        n_out(s.batch * s.seq * s.channels()),
        n_stats(s.batch * s.heads * s.seq),
        qkv(n_qkv, stream),
        out(n_out, stream),
        dout(n_out, stream),
        dqkv(n_qkv, stream),
        stats(n_stats, stream) {}
  size_t n_qkv, n_out, n_stats;
  DeviceVector<uint16_t> qkv, out, dout, dqkv;
  DeviceVector<float> stats;
};

// Fills out and dqkv with bf16 NaNs (0xffff) and stats with fp32 NaNs.
void poison(Buffers& b, cudaStream_t stream) {
  MP_CHECK_CUDA(cudaMemsetAsync(b.out.get(), 0xff, b.n_out * 2, stream));
  MP_CHECK_CUDA(cudaMemsetAsync(b.dqkv.get(), 0xff, b.n_qkv * 2, stream));
  MP_CHECK_CUDA(cudaMemsetAsync(b.stats.get(), 0xff, b.n_stats * 4, stream));
}

// a and b hold the same bits; names the first difference.
template <class T>
void expect_same_runs(const std::vector<T>& a, const std::vector<T>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " differs between the two runs";
      return;
    }
  }
}

TEST_F(CudnnAttention, MatchesFloat64AndRepeats) {
  // GPT-2's head size 64 and 128; B = 1, T = 1, one head and several; T not a
  // multiple of 64 (cuDNN may refuse those: reported, not failed).
  const std::vector<Case> cases = {
      {{1, 1, 1, 64}, false},   {{2, 3, 64, 64}, true},   {{1, 12, 256, 64}, true}, {{2, 2, 128, 128}, true},
      {{1, 2, 100, 64}, false}, {{3, 1, 37, 128}, false}, {{1, 4, 17, 32}, false},
  };
  for (const Case& c : cases) {
    const SdpaShape s = c.shape;
    SCOPED_TRACE(sdpa_shape_name(s));
    std::string reason;
    if (!attention_cudnn_supported(s, &reason)) {
      EXPECT_FALSE(c.must_be_supported) << reason;
      std::cout << "cuDNN refused " << sdpa_shape_name(s) << ": " << reason << "\n";
      RecordProperty("refused_" + sdpa_shape_name(s), reason);
      continue;
    }
    const int64_t rows = s.batch * s.seq, ch = s.channels(), hs = s.head_dim, T = s.seq;
    const auto qkv16 = to_bf16(random_floats(rows * 3 * ch, 1, -2.0f, 2.0f));
    const auto dout16 = to_bf16(random_floats(rows * ch, 2));
    const auto qkv = widen(qkv16), dout = widen(dout16);

    // The float64 reference, and the magnitudes of Note [cuDNN attention tolerance].
    std::vector<double> att(s.batch * s.heads * T * T), out(rows * ch), dqkv(rows * 3 * ch),
        scratch(s.batch * s.heads * T);
    gpt_attention_forward(qkv.data(), s.batch, T, ch, s.heads, att.data(), out.data(), 1);
    gpt_attention_backward(qkv.data(), att.data(), dout.data(), s.batch, T, ch, s.heads, scratch.data(), dqkv.data(),
                           1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    std::vector<double> m_out(out.size()), m_dqkv(dqkv.size()), lse(s.batch * s.heads * T);
    const auto q_at = [&](int64_t b, int64_t t, int which, int64_t h, int64_t d) {
      return (b * T + t) * 3 * ch + which * ch + h * hs + d;
    };
    const auto o_at = [&](int64_t b, int64_t t, int64_t h, int64_t d) { return (b * T + t) * ch + h * hs + d; };
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t h = 0; h < s.heads; ++h) {
        const double* p = att.data() + (b * s.heads + h) * T * T;
        for (int64_t t = 0; t < T; ++t) {
          double a = 0, m = -INFINITY, sum = 0;
          for (int64_t d = 0; d < hs; ++d) a += std::fabs(dout[o_at(b, t, h, d)] * out[o_at(b, t, h, d)]);
          std::vector<double> score(t + 1);
          for (int64_t j = 0; j <= t; ++j) {
            for (int64_t d = 0; d < hs; ++d) score[j] += qkv[q_at(b, t, 0, h, d)] * qkv[q_at(b, j, 1, h, d)];
            m = std::max(m, score[j] * scale);
          }
          for (int64_t j = 0; j <= t; ++j) sum += std::exp(score[j] * scale - m);
          lse[(b * s.heads + h) * T + t] = m + std::log(sum);
          for (int64_t j = 0; j <= t; ++j) {
            double dp = 0;
            for (int64_t d = 0; d < hs; ++d) dp += dout[o_at(b, t, h, d)] * qkv[q_at(b, j, 2, h, d)];
            const double g = p[t * T + j] * (std::fabs(dp) + a);
            for (int64_t d = 0; d < hs; ++d) {
              m_out[o_at(b, t, h, d)] += p[t * T + j] * std::fabs(qkv[q_at(b, j, 2, h, d)]);
              m_dqkv[q_at(b, t, 0, h, d)] += 3 * scale * g * std::fabs(qkv[q_at(b, j, 1, h, d)]);
              m_dqkv[q_at(b, j, 1, h, d)] += 3 * scale * g * std::fabs(qkv[q_at(b, t, 0, h, d)]);
              m_dqkv[q_at(b, j, 2, h, d)] += 2 * p[t * T + j] * std::fabs(dout[o_at(b, t, h, d)]);
            }
          }
        }
      }
    }
    for (double& x : m_out) x *= 2 * kU;
    for (double& x : m_dqkv) x *= kU;

    const int64_t ws_bytes = attention_cudnn_workspace_bytes(s);
    void* ws = nullptr;
    if (ws_bytes > 0) MP_CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    std::vector<uint16_t> runs_out[2], runs_dqkv[2];
    std::vector<float> runs_stats[2];
    for (int r = 0; r < 2; ++r) {
      Buffers buf(s, stream_);
      copy_on_stream(buf.qkv.get(), qkv16.data(), qkv16.size() * 2, stream_);
      copy_on_stream(buf.dout.get(), dout16.data(), dout16.size() * 2, stream_);
      poison(buf, stream_);
      const auto* q = reinterpret_cast<const bf16*>(buf.qkv.get());
      attention_cudnn_forward(s, q, reinterpret_cast<bf16*>(buf.out.get()), buf.stats.get(), ws, ws_bytes, stream_);
      attention_cudnn_backward(s, q, reinterpret_cast<const bf16*>(buf.out.get()),
                               reinterpret_cast<const bf16*>(buf.dout.get()), buf.stats.get(),
                               reinterpret_cast<bf16*>(buf.dqkv.get()), ws, ws_bytes, stream_);
      MP_CHECK_CUDA(cudaStreamSynchronize(stream_));
      runs_out[r] = buf.out.host();
      runs_dqkv[r] = buf.dqkv.host();
      runs_stats[r] = buf.stats.host();
    }
    if (ws != nullptr) MP_CHECK_CUDA(cudaFree(ws));

    expect_within(runs_out[0], out, m_out, 2.0, "out");
    expect_within(runs_dqkv[0], dqkv, m_dqkv, 2.0, "dqkv");
    int stats_misses = 0;
    for (size_t i = 0; i < lse.size(); ++i) {
      const double got = runs_stats[0][i];
      if (!(std::fabs(got - lse[i]) <= 1e-4 * (1 + std::fabs(lse[i]))) && ++stats_misses <= 5) {
        ADD_FAILURE() << "stats[" << i << "]: got " << got << ", want the log-sum-exp " << lse[i];
      }
    }
    EXPECT_EQ(stats_misses, 0);
    expect_same_runs(runs_out[0], runs_out[1], "out run twice");
    expect_same_runs(runs_dqkv[0], runs_dqkv[1], "dqkv run twice (the deterministic backward)");
    expect_same_runs(runs_stats[0], runs_stats[1], "stats run twice");
  }
}

// A head size no cuDNN attention engine takes: refused before anything runs,
// by every entry point, naming the shape; asking again gives the same answer.
TEST_F(CudnnAttention, RefusesAShapeItCannotRun) {
  const SdpaShape s{1, 1, 16, 1024};
  std::string reason;
  ASSERT_FALSE(attention_cudnn_supported(s, &reason));
  EXPECT_TRUE(contains(reason, "cuDNN refused causal attention for (B=1, H=1, T=16, hs=1024)")) << reason;
  std::string again;
  EXPECT_FALSE(attention_cudnn_supported(s, &again));
  EXPECT_EQ(again, reason);
  EXPECT_EQ(error_of<CudnnUnsupportedError>([&] { attention_cudnn_workspace_bytes(s); }), reason);
  Buffers buf(s, stream_);
  const auto* q = reinterpret_cast<const bf16*>(buf.qkv.get());
  EXPECT_EQ(error_of<CudnnUnsupportedError>([&] {
              attention_cudnn_forward(s, q, reinterpret_cast<bf16*>(buf.out.get()), buf.stats.get(), nullptr, 0,
                                      stream_);
            }),
            reason);
  EXPECT_EQ(error_of<CudnnUnsupportedError>([&] {
              attention_cudnn_backward(s, q, reinterpret_cast<const bf16*>(buf.out.get()),
                                       reinterpret_cast<const bf16*>(buf.dout.get()), buf.stats.get(),
                                       reinterpret_cast<bf16*>(buf.dqkv.get()), nullptr, 0, stream_);
            }),
            reason);
}

// Host-side checks: a misaligned pointer and a short workspace are
// EnforceErrors naming the shape, before cuDNN sees them.
TEST_F(CudnnAttention, ChecksPointersAndWorkspace) {
  const SdpaShape s{1, 2, 64, 64};
  std::string reason;
  ASSERT_TRUE(attention_cudnn_supported(s, &reason)) << reason;
  Buffers buf(s, stream_);
  const auto* q = reinterpret_cast<const bf16*>(buf.qkv.get());
  auto* out = reinterpret_cast<bf16*>(buf.out.get());
  const int64_t ws_bytes = attention_cudnn_workspace_bytes(s);
  EXPECT_TRUE(contains(error_of<EnforceError>([&] {
                         attention_cudnn_forward(s, q + 1, out, buf.stats.get(), nullptr, ws_bytes, stream_);
                       }),
                       "qkv at"));
  if (ws_bytes > 0) {
    void* ws = nullptr;
    MP_CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    const std::string msg =
        error_of<EnforceError>([&] { attention_cudnn_forward(s, q, out, buf.stats.get(), ws, ws_bytes - 1, stream_); });
    EXPECT_TRUE(contains(msg, "(B=1, H=2, T=64, hs=64) needs " + std::to_string(ws_bytes) + " bytes")) << msg;
    MP_CHECK_CUDA(cudaFree(ws));
  }
  const std::string d = attention_cudnn_describe();
  EXPECT_TRUE(contains(d, "cuDNN 9") && contains(d, "frontend 1.32.0")) << d;
}

// MP_CHECK_CUDNN (core/error_cuda.h) names the status and its category; no
// device needed.
TEST(CudnnError, NamesTheStatusAndItsCategory) {
  const std::string msg = error_of<CudaError>([] { MP_CHECK_CUDNN(3002); });
  EXPECT_TRUE(contains(msg, "Call to 3002 failed: cuDNN status 3002 (category CUDNN_STATUS_NOT_SUPPORTED)")) << msg;
  EXPECT_EQ(error_of<CudaError>([] { MP_CHECK_CUDNN(0); }), "(no error)");
}

}  // namespace
}  // namespace mp

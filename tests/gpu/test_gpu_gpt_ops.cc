// GPU tests (label "gpu"): the fp32 CUDA kernels of kernels/cuda/
// gpt_ops_cuda.h (the embedding, the MLP's bias gradient and loss) and the
// reference attention (tests/gpu/reference_attention.h) against the double
// instantiation of the CPU op (kernels/cpu/) on tiny awkward shapes, within
// fp32 rounding.
// Every deterministic kernel runs twice and must give the same bits. The
// LayerNorm, classifier and cast kernels: test_gpu_act_ops.cc; the GEMM:
// test_gpu_gemm.cc.
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
#include "kernels/cpu/attention.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/loss.h"
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/cuda/gpt_ops_cuda.h"
#include "tests/gpt_test_ops.h"
#include "tests/gpu/gpu_data.h"
#include "tests/gpu/gpu_shapes.h"
#include "tests/gpu/gpu_test.h"
#include "tests/gpu/reference_attention.h"

namespace mp {
namespace {

using namespace mp::testing;  // NOLINT(build/namespaces): the shared test data helpers

class GpuOps : public testing::GpuStreamTest {};

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

// ---- bias (the MLP's) -------------------------------------------------------------

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

// ---- attention ----------------------------------------------------------------------

TEST_F(GpuOps, AttentionMatchesCpuAndRepeats) {
  for (const gpu_shapes::Attention s : gpu_shapes::kReferenceAttention) {
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
  for (const auto& [rows, vocab, padded] : gpu_shapes::kClassifier) {
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
      gpt_softmax_xent_rows_cuda(dz.get(), dt.get(), rows, vocab, padded, rows, loss.get(), grad.get(), stream_);
      gpt_mean_loss_cuda(loss.get(), rows, dmean.get(), stream_);
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
    gpt_softmax_xent_rows_cuda(dz.get(), bad.get(), rows, vocab, padded, rows, loss.get(), grad.get(), stream_);
    const auto l = loss.host();
    EXPECT_TRUE(std::isnan(l[0]));
    EXPECT_FALSE(std::isnan(l[1]));
    EXPECT_TRUE(std::isnan(grad.host()[0]));
  }
}

}  // namespace
}  // namespace mp

// GPU tests (label "gpu"): the kernels on the bf16 recipes' activations
// (kernels/act.h) against their CPU bodies (kernels/cpu/: layernorm.h, attention.h, loss.h) on
// the same inputs: LayerNorm forward and its one-kernel backward
// (kernels/cuda/layernorm_cuda.h), the fused classifier (classifier_cuda.h),
// the casts (cast_cuda.h) and the flash attention's bf16 glue
// (attention_cuda.h). Tolerances: fp32 rounding of other summation orders
// (1e-5 relative) where outputs are fp32; where they are bf16, one bf16
// rounding (2^-8 relative) on top, as both sides round a slightly different
// fp32 value. Every kernel runs twice and must give the same bits; outputs
// start poisoned so every element must be written.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/loss.h"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/classifier_cuda.h"
#include "kernels/cuda/layernorm_cuda.h"
#include "tests/gpt_test_ops.h"
#include "tests/gpu/gpu_data.h"
#include "tests/gpu/gpu_shapes.h"
#include "tests/gpu/gpu_test.h"

namespace mp {
namespace {

using namespace mp::testing;  // NOLINT(build/namespaces): the shared test data helpers

class GpuActOps : public testing::GpuStreamTest {};

constexpr double kBf16 = 1.0 / 256;  // one rounding to 8 significant bits

std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float x : v) out.push_back(math::f32_to_bf16_bits(x));
  return out;
}
std::vector<float> widen_bits(const std::vector<uint16_t>& v) {
  std::vector<float> out;
  for (uint16_t h : v) out.push_back(math::bf16_bits_to_f32(h));
  return out;
}
std::vector<double> as_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

Act bf16_act(void* p) { return Act{p, DType::kBF16, true}; }

// ---- layernorm --------------------------------------------------------------------

TEST_F(GpuActOps, LayerNormMatchesTheCpuBodyInFp32AndBf16AndRepeats) {
  for (const auto& [rows, channels] : gpu_shapes::kLayerNorm) {
    SCOPED_TRACE(detail::str(rows, " rows x ", channels, " channels"));
    const auto x = random_floats(rows * channels, 1, -2.0f, 3.0f), w = random_floats(channels, 2),
               b = random_floats(channels, 3), g = random_floats(rows * channels, 4),
               dx0 = random_floats(rows * channels, 5);
    const std::vector<float> g16 = widen_bits(to_bf16_bits(g));
    // The CPU body: fp32 forward, backward from the bf16 gradient.
    std::vector<float> y(x.size()), mean(rows), rstd(rows), dx = dx0, dw(channels), db(channels);
    gpt_layernorm_forward<float>(x.data(), w.data(), b.data(), rows, channels, y.data(), mean.data(), rstd.data(), 1);
    gpt_layernorm_backward<float>(g16.data(), x.data(), w.data(), mean.data(), rstd.data(), rows, channels, dx.data(),
                                  dw.data(), db.data(), 1);
    const int64_t ws_bytes = gpt_layernorm_backward_cuda_workspace_bytes(rows, channels);
    DeviceVector<float> dxin(x, stream_), dwt(w, stream_), dbt(b, stream_);
    DeviceVector<uint16_t> dg(to_bf16_bits(g), stream_);
    DeviceVector<char> ws(static_cast<size_t>(ws_bytes), stream_);
    std::vector<float> runs[2][7];
    for (auto& run : runs) {
      DeviceVector<float> o(random_floats(x.size(), 6), stream_), m(rows, stream_), r(rows, stream_),
          ddx(dx0, stream_), ddw(random_floats(channels, 7), stream_), ddb(random_floats(channels, 8), stream_);
      DeviceVector<uint16_t> o16(x.size(), stream_), copy(x.size(), stream_);
      gpt_layernorm_forward_cuda(dxin.get(), dwt.get(), dbt.get(), rows, channels, f32_act(o.get()), m.get(), r.get(),
                                 stream_);
      gpt_layernorm_forward_cuda(dxin.get(), dwt.get(), dbt.get(), rows, channels, bf16_act(o16.get()), m.get(),
                                 r.get(), stream_);
      gpt_layernorm_backward_cuda(bf16_act(dg.get()), dxin.get(), dwt.get(), m.get(), r.get(), rows, channels,
                                  ddx.get(), /*accumulate=*/true, bf16_act(copy.get()), ddw.get(), ddb.get(), ws.get(),
                                  stream_);
      run[0] = o.host();
      run[1] = widen_bits(o16.host());
      run[2] = m.host();
      run[3] = ddx.host();
      run[4] = widen_bits(copy.host());
      run[5] = ddw.host();
      run[6] = ddb.host();
    }
    expect_close(runs[0][0], as_double(y), 1e-5, 1e-5, "layernorm out");
    expect_close(runs[0][1], as_double(y), kBf16, 1e-5, "layernorm bf16 out");
    expect_close(runs[0][2], as_double(mean), 1e-5, 1e-6, "layernorm mean");
    expect_close(runs[0][3], as_double(dx), 1e-4, 1e-5, "layernorm dx (accumulated)");
    expect_close(runs[0][4], as_double(dx), kBf16, 1e-5, "layernorm dx copy");
    expect_close(runs[0][5], as_double(dw), 1e-4, 1e-4, "layernorm dw");
    expect_close(runs[0][6], as_double(db), 1e-4, 1e-4, "layernorm db");
    for (int i = 0; i < 7; ++i) expect_same_bits(runs[0][i], runs[1][i], "layernorm run twice");
    // Overwriting dx (the head's ln_f): the gradient alone, from fp32 dout.
    std::vector<float> alone(x.size(), 0.0f);
    gpt_layernorm_backward<float>(g.data(), x.data(), w.data(), mean.data(), rstd.data(), rows, channels, alone.data(),
                                  dw.data(), db.data(), 1);
    DeviceVector<float> dg32(g, stream_), m(rows, stream_), r(rows, stream_), ddx(random_floats(x.size(), 9), stream_),
        ddw(channels, stream_), ddb(channels, stream_), o(x.size(), stream_);
    gpt_layernorm_forward_cuda(dxin.get(), dwt.get(), dbt.get(), rows, channels, f32_act(o.get()), m.get(), r.get(),
                               stream_);
    gpt_layernorm_backward_cuda(f32_act(dg32.get()), dxin.get(), dwt.get(), m.get(), r.get(), rows, channels, ddx.get(),
                                /*accumulate=*/false, Act{}, ddw.get(), ddb.get(), ws.get(), stream_);
    expect_close(ddx.host(), as_double(alone), 1e-4, 1e-5, "layernorm dx (overwritten)");
    expect_close(ddw.host(), as_double(dw), 1e-4, 1e-4, "layernorm dw (fp32 dout)");
  }
}

// ---- classifier -------------------------------------------------------------------

TEST_F(GpuActOps, ClassifierMatchesTheCpuBodyAndRepeats) {
  for (const auto& [rows, vocab, padded] : gpu_shapes::kClassifier) {
    SCOPED_TRACE(detail::str(rows, " rows, vocab ", vocab, ", padded ", padded));
    const auto logits = random_floats(rows * padded, 1, -8.0f, 8.0f);
    std::vector<int32_t> targets(rows);
    for (int64_t n = 0; n < rows; ++n) targets[n] = static_cast<int32_t>((n * 13 + 5) % vocab);
    const int64_t loss_rows = rows + 3;
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE(bf16 ? "bf16 logits" : "fp32 logits");
      std::vector<float> z = bf16 ? widen_bits(to_bf16_bits(logits)) : logits, loss(rows);
      const std::vector<float> values = z;
      gpt_classifier(f32_act(z.data()), targets.data(), rows, vocab, padded, loss_rows, loss.data(), 1);
      DeviceVector<int32_t> dt(targets, stream_);
      std::vector<float> runs[2][2];
      for (auto& run : runs) {
        DeviceVector<float> dloss(random_floats(rows, 2), stream_), d32(values, stream_);
        DeviceVector<uint16_t> d16(to_bf16_bits(values), stream_);
        const Act act = bf16 ? bf16_act(d16.get()) : f32_act(d32.get());
        gpt_classifier_cuda(act, dt.get(), rows, vocab, padded, loss_rows, dloss.get(), stream_);
        run[0] = dloss.host();
        run[1] = bf16 ? widen_bits(d16.host()) : d32.host();
      }
      expect_close(runs[0][0], as_double(loss), 1e-5, 1e-6, "row loss");
      // The gradient: fp32, or rounded to bf16 by both sides.
      expect_close(runs[0][1], as_double(z), bf16 ? kBf16 : 1e-5, 1e-7 / static_cast<double>(loss_rows), "d logits");
      for (int64_t n = 0; n < rows; ++n) {
        for (int64_t c = vocab; c < padded; ++c) ASSERT_EQ(runs[0][1][n * padded + c], 0.0f) << n << ", " << c;
      }
      for (int i = 0; i < 2; ++i) expect_same_bits(runs[0][i], runs[1][i], "classifier run twice");
    }
    // A target outside [0, vocab): that row's loss and gradient are NaN, the others are not.
    targets[0] = static_cast<int32_t>(vocab);
    DeviceVector<int32_t> bad(targets, stream_);
    DeviceVector<float> dloss(rows, stream_), dz(logits, stream_);
    gpt_classifier_cuda(f32_act(dz.get()), bad.get(), rows, vocab, padded, rows, dloss.get(), stream_);
    const auto l = dloss.host(), g = dz.host();
    EXPECT_TRUE(std::isnan(l[0]));
    EXPECT_FALSE(std::isnan(l[1]));
    EXPECT_TRUE(std::isnan(g[0]));
    EXPECT_FALSE(std::isnan(g[padded]));
  }
}

// ---- casts --------------------------------------------------------------------------

TEST_F(GpuActOps, CastsGiveTheCpuBitsAlignedOrNot) {
  const int64_t n = 1001;
  const auto x = random_floats(n + 3, 1, -5.0f, 5.0f);
  for (int64_t offset : {0, 1, 3}) {  // 16-byte aligned or not
    SCOPED_TRACE(detail::str("offset ", offset));
    DeviceVector<float> src(x, stream_), back(n, stream_), through(n, stream_);
    DeviceVector<uint16_t> to16(n + 3, stream_);
    gpt_round_to_bf16_cuda(src.get() + offset, n, DType::kBF16, to16.get() + offset, stream_);
    gpt_round_to_bf16_cuda(src.get() + offset, n, DType::kF32, through.get(), stream_);
    gpt_convert_cuda(bf16_act(to16.get() + offset), f32_act(back.get()), n, stream_);
    const auto h16 = to16.host();
    const auto h32 = through.host(), hb = back.host();
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t bits = math::f32_to_bf16_bits(x[static_cast<size_t>(i + offset)]);
      ASSERT_EQ(h16[static_cast<size_t>(i + offset)], bits) << i;
      ASSERT_EQ(h32[static_cast<size_t>(i)], math::bf16_bits_to_f32(bits)) << i;
      ASSERT_EQ(hb[static_cast<size_t>(i)], math::bf16_bits_to_f32(bits)) << i;
    }
  }
  // Ranges of bf16 widened in one launch; the rest of dst untouched.
  const std::vector<uint16_t> b = to_bf16_bits(x);
  DeviceVector<uint16_t> db(b, stream_);
  DeviceVector<float> dst(std::vector<float>(x.size(), -3.0f), stream_);
  const int64_t begins[] = {0, 10, 500}, ends[] = {4, 10, 1004};
  widen_ranges_cuda(db.get(), DType::kBF16, dst.get(), begins, ends, 3, stream_);
  const auto h = dst.host();
  for (size_t i = 0; i < h.size(); ++i) {
    const bool inside = i < 4 || (i >= 500 && i < 1004);
    ASSERT_EQ(h[i], inside ? math::bf16_bits_to_f32(b[i]) : -3.0f) << i;
  }
}

// ---- attention's fp32 kernels on bf16 activations ------------------------------------

TEST_F(GpuActOps, FlashAttentionOnBf16ActivationsRoundsItsFp32Result) {
  const AttentionCudaShape s{2, 70, 32, 4};  // in gpu_shapes::kFlashAttention
  const int64_t rows = s.batch * s.seq, rc = rows * s.channels;
  const auto qkv = widen_bits(to_bf16_bits(random_floats(3 * rc, 1, -2.0f, 2.0f)));
  const auto g = widen_bits(to_bf16_bits(random_floats(rc, 2)));
  // The CPU body on the same values.
  std::vector<float> att(static_cast<size_t>(s.batch * s.heads * s.seq * s.seq)), y(rc), own(s.batch * s.heads * s.seq),
      dqkv(3 * rc);
  gpt_attention_forward<float>(qkv.data(), s.batch, s.seq, s.channels, s.heads, att.data(), y.data(), 1);
  gpt_attention_backward<float>(qkv.data(), att.data(), g.data(), s.batch, s.seq, s.channels, s.heads, own.data(),
                                dqkv.data(), 1);
  DeviceVector<uint16_t> dq(to_bf16_bits(qkv), stream_), dg(to_bf16_bits(g), stream_), dout(rc, stream_),
      ddq(3 * rc, stream_);
  DeviceVector<float> saved(s.batch * s.heads * s.seq, stream_);
  DeviceVector<char> scratch(static_cast<size_t>(attention_cuda_scratch_bytes(s, false, true)), stream_);
  attention_forward_cuda(s, false, bf16_act(dq.get()), bf16_act(dout.get()), saved.get(), scratch.get(), stream_);
  attention_backward_cuda(s, false, bf16_act(dq.get()), bf16_act(dout.get()), saved.get(), bf16_act(dg.get()),
                          scratch.get(), bf16_act(ddq.get()), stream_);
  expect_close(widen_bits(dout.host()), as_double(y), kBf16, 1e-4, "attention out");
  // The backward reads the rounded output: a few bf16 roundings of error.
  expect_close(widen_bits(ddq.host()), as_double(dqkv), 4 * kBf16, 1e-3, "attention dqkv");
}

}  // namespace
}  // namespace mp

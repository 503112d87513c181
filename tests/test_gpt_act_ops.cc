// The GPT ops on activations that may hold bf16 values (kernels/cpu/
// kernels/cpu/: layernorm.h, attention.h, loss.h, elementwise.h): each against the plain float op on the same fp32 values,
// bit for bit, its outputs rounded to bf16 where they hold bf16 values;
// bf16 values stored as bf16 and as fp32 give the same bits.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/loss.h"
#include "tests/gpt_test_ops.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::contains;
using testing::error_of;

std::vector<float> randoms(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

float round_bf16(float x) { return math::to_f32(math::from_f32<bf16>(x)); }

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// bf16 values held three ways: bf16 storage, fp32 storage, and their fp32.
struct Bf16Values {
  std::vector<bf16> b16;
  std::vector<float> f32;  // the values, exactly
  explicit Bf16Values(const std::vector<float>& v) {
    for (float x : v) b16.push_back(math::from_f32<bf16>(x));
    for (bf16 h : b16) f32.push_back(math::to_f32(h));
  }
  explicit Bf16Values(size_t n) : b16(n, math::from_f32<bf16>(-9.0f)), f32(n, -9.0f) {}
  Act act16() { return Act{b16.data(), DType::kBF16, true}; }
  Act act32() { return Act{f32.data(), DType::kF32, true}; }
  std::vector<float> widened() const {
    std::vector<float> out;
    for (bf16 h : b16) out.push_back(math::to_f32(h));
    return out;
  }
};

constexpr int64_t kRows = 10, kChannels = 24, kThreads = 2;

TEST(GptActOps, LayerNormForwardRoundsTheFloatOpsOutput) {
  std::vector<float> x = randoms(kRows * kChannels, 1, 2.0f), w = randoms(kChannels, 2), b = randoms(kChannels, 3);
  std::vector<float> y(x.size()), mean(kRows), rstd(kRows);
  gpt_layernorm_forward<float>(x.data(), w.data(), b.data(), kRows, kChannels, y.data(), mean.data(), rstd.data(), 1);
  std::vector<float> scratch(static_cast<size_t>(gpt_layernorm_act_scratch_elements(kRows, kChannels)));
  Bf16Values out(x.size());
  std::vector<float> mean2(kRows), rstd2(kRows);
  gpt_layernorm_forward(x.data(), w.data(), b.data(), kRows, kChannels, out.act16(), mean2.data(), rstd2.data(),
                        scratch.data(), kThreads);
  EXPECT_EQ(out.widened(), rounded(y));
  EXPECT_EQ(mean2, mean);
  EXPECT_EQ(rstd2, rstd);
  gpt_layernorm_forward(x.data(), w.data(), b.data(), kRows, kChannels, out.act32(), mean2.data(), rstd2.data(),
                        scratch.data(), kThreads);
  EXPECT_EQ(out.f32, rounded(y));
  std::vector<float> plain(x.size());
  gpt_layernorm_forward(x.data(), w.data(), b.data(), kRows, kChannels, f32_act(plain.data()), mean2.data(),
                        rstd2.data(), nullptr, kThreads);
  EXPECT_EQ(plain, y);
}

TEST(GptActOps, LayerNormBackwardOnBf16GradientsAccumulatesOrOverwritesAndCopies) {
  std::vector<float> x = randoms(kRows * kChannels, 4, 2.0f), w = randoms(kChannels, 5), b = randoms(kChannels, 6);
  std::vector<float> y(x.size()), mean(kRows), rstd(kRows);
  gpt_layernorm_forward<float>(x.data(), w.data(), b.data(), kRows, kChannels, y.data(), mean.data(), rstd.data(), 1);
  Bf16Values dout(randoms(kRows * kChannels, 7));
  const std::vector<float> dx0 = randoms(kRows * kChannels, 8);
  std::vector<float> dx_ref = dx0, dw_ref(kChannels), db_ref(kChannels);
  gpt_layernorm_backward<float>(dout.f32.data(), x.data(), w.data(), mean.data(), rstd.data(), kRows, kChannels,
                                dx_ref.data(), dw_ref.data(), db_ref.data(), 1);
  std::vector<float> scratch(static_cast<size_t>(gpt_layernorm_act_scratch_elements(kRows, kChannels)));
  for (bool accumulate : {true, false}) {
    std::vector<float> dx = dx0, dw(kChannels), db(kChannels);
    Bf16Values copy(x.size());
    gpt_layernorm_backward(dout.act16(), x.data(), w.data(), mean.data(), rstd.data(), kRows, kChannels, dx.data(),
                           accumulate, copy.act16(), dw.data(), db.data(), scratch.data(), kThreads);
    std::vector<float> expected = dx_ref;
    if (!accumulate) {  // the gradient alone: the reference from a zero dx
      std::vector<float> zero(x.size(), 0.0f);
      gpt_layernorm_backward<float>(dout.f32.data(), x.data(), w.data(), mean.data(), rstd.data(), kRows, kChannels,
                                    zero.data(), dw_ref.data(), db_ref.data(), 1);
      expected = zero;
    }
    EXPECT_EQ(dx, expected) << accumulate;
    EXPECT_EQ(copy.widened(), rounded(expected)) << accumulate;
    EXPECT_EQ(dw, dw_ref);
    EXPECT_EQ(db, db_ref);
  }
}

TEST(GptActOps, AttentionRoundsTheFloatOpsOutputsFromTheSameValues) {
  const int64_t batch = 2, seq = 5, channels = 12, heads = 3, rows = batch * seq;
  Bf16Values qkv(randoms(3 * rows * channels, 9, 2.0f)), dout(randoms(rows * channels, 10));
  std::vector<float> att(static_cast<size_t>(batch * heads * seq * seq)), y(static_cast<size_t>(rows * channels));
  gpt_attention_forward<float>(qkv.f32.data(), batch, seq, channels, heads, att.data(), y.data(), 1);
  std::vector<float> own(static_cast<size_t>(batch * heads * seq)), dqkv(qkv.f32.size());
  gpt_attention_backward<float>(qkv.f32.data(), att.data(), dout.f32.data(), batch, seq, channels, heads, own.data(),
                                dqkv.data(), 1);
  std::vector<float> scratch(static_cast<size_t>(gpt_attention_act_scratch_elements(batch, seq, channels, heads)));
  std::vector<float> att2(att.size());
  Bf16Values out(y.size()), dqkv16(dqkv.size());
  gpt_attention_forward(qkv.act16(), batch, seq, channels, heads, att2.data(), out.act16(), scratch.data(), kThreads);
  EXPECT_EQ(att2, att);
  EXPECT_EQ(out.widened(), rounded(y));
  gpt_attention_backward(qkv.act16(), att2.data(), dout.act16(), batch, seq, channels, heads, dqkv16.act16(),
                         scratch.data(), kThreads);
  EXPECT_EQ(dqkv16.widened(), rounded(dqkv));
  // bf16 values in fp32 storage: the same.
  gpt_attention_backward(qkv.act32(), att2.data(), dout.act32(), batch, seq, channels, heads, dqkv16.act32(),
                         scratch.data(), kThreads);
  EXPECT_EQ(dqkv16.f32, rounded(dqkv));
}

TEST(GptActOps, ClassifierIsTheLossInPlaceRoundedLikeTheLogits) {
  const int64_t rows = 6, vocab = 50, padded = 64, loss_rows = 9;
  const std::vector<float> logits = randoms(rows * padded, 11, 4.0f);
  const std::vector<int32_t> targets = {0, 49, 7, 7, 13, 30};
  // fp32: the loss's own bits, in place.
  std::vector<float> ref_loss(rows), ref_grad(logits.size());
  gpt_softmax_xent_rows(logits.data(), targets.data(), rows, vocab, padded, loss_rows, ref_loss.data(),
                        ref_grad.data(), DType::kF32, nullptr, 1);
  std::vector<float> z = logits, loss(rows);
  gpt_classifier(f32_act(z.data()), targets.data(), rows, vocab, padded, loss_rows, loss.data(), kThreads);
  EXPECT_EQ(loss, ref_loss);
  EXPECT_EQ(z, ref_grad);
  // bf16 logits: the loss of their values, the gradient rounded in place.
  Bf16Values z16(logits);
  std::vector<float> grad16(logits.size());
  gpt_softmax_xent_rows(z16.f32.data(), targets.data(), rows, vocab, padded, loss_rows, ref_loss.data(),
                        grad16.data(), DType::kF32, nullptr, 1);
  gpt_classifier(z16.act16(), targets.data(), rows, vocab, padded, loss_rows, loss.data(), kThreads);
  EXPECT_EQ(loss, ref_loss);
  EXPECT_EQ(z16.widened(), rounded(grad16));
  gpt_classifier(z16.act32(), targets.data(), rows, vocab, padded, loss_rows, loss.data(), kThreads);
  EXPECT_EQ(loss, ref_loss);
  EXPECT_EQ(z16.f32, rounded(grad16));
  // A bad target: an error naming it, nothing written.
  Bf16Values bad(logits);
  const std::vector<bf16> before = bad.b16;
  const std::vector<int32_t> wrong = {0, 1, 2, 50, 4, 5};
  EXPECT_PRED2(contains,
               error_of<EnforceError>([&] {
                 gpt_classifier(bad.act16(), wrong.data(), rows, vocab, padded, loss_rows, loss.data(), kThreads);
               }),
               "target 50 at row 3 outside [0, 50)");
  EXPECT_EQ(std::memcmp(bad.b16.data(), before.data(), before.size() * sizeof(bf16)), 0);
}

TEST(GptActOps, ConvertWidensRoundsOrCopies) {
  const std::vector<float> x = randoms(37, 12);
  Bf16Values to16(x.size());
  std::vector<float> back(x.size()), copy(x.size());
  gpt_convert(f32_act(const_cast<float*>(x.data())), to16.act16(), 37, kThreads);
  EXPECT_EQ(to16.widened(), rounded(x));
  gpt_convert(to16.act16(), f32_act(back.data()), 37, kThreads);
  EXPECT_EQ(back, rounded(x));
  gpt_convert(f32_act(const_cast<float*>(x.data())), f32_act(copy.data()), 37, kThreads);
  EXPECT_EQ(copy, x);
}

}  // namespace
}  // namespace mp

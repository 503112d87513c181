// The GPT layer ops on the CPU (kernels/cpu/: embedding, layernorm, matmul, attention, loss, elementwise): every backward against central finite
// differences in double, plus the ops' own invariants.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/convert_math.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/loss.h"
#include "tests/gpt_test_ops.h"
#include "tests/gpt_test_util.h"

namespace mp {
namespace {

using namespace mp::testing;  // NOLINT(build/namespaces)

TEST(GptOps, LayerNormBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, c = 7;
  Vec x = random_vec(rows * c, 1, 2.0, 0.5), w = random_vec(c, 2, 0.5, 1.0), b = random_vec(c, 3);
  const Vec r = random_vec(rows * c, 4);
  Vec out(x.size()), mean(rows), rstd(rows);
  auto f = [&] {
    gpt_layernorm_forward(x.data(), w.data(), b.data(), rows, c, out.data(), mean.data(), rstd.data(), 1);
    return weighted_sum(out, r);
  };
  f();
  Vec dx(x.size(), 0.0), dw(c), db(c);
  gpt_layernorm_backward(r.data(), x.data(), w.data(), mean.data(), rstd.data(), rows, c, dx.data(), dw.data(),
                         db.data(), 1);
  FdCheck fd("layernorm");
  fd.check("x", x, dx, f);
  fd.check("w", w, dw, f);
  fd.check("b", b, db, f);
  // dx accumulates.
  Vec dx2(x.size(), 1.0);
  gpt_layernorm_backward(r.data(), x.data(), w.data(), mean.data(), rstd.data(), rows, c, dx2.data(), dw.data(),
                         db.data(), 1);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_EQ(dx2[i], 1.0 + dx[i]) << i;
}

TEST(GptOps, MatmulBackwardMatchesFiniteDifferences) {
  const int64_t rows = 5, in = 6, out = 7;  // rows > the row block, in not a multiple of it
  Vec x = random_vec(rows * in, 5), w = random_vec(in * out, 6), b = random_vec(out, 7);
  const Vec r = random_vec(rows * out, 8);
  Vec y(rows * out);
  auto f = [&] {
    gpt_matmul_forward(x.data(), w.data(), b.data(), rows, in, out, y.data(), 1);
    return weighted_sum(y, r);
  };
  Vec dx(x.size()), dw(w.size()), db(b.size());
  gpt_matmul_backward(x.data(), w.data(), r.data(), rows, in, out, dx.data(), dw.data(), db.data(), 1);
  FdCheck fd("matmul");
  fd.check("x", x, dx, f);
  fd.check("w", w, dw, f);
  fd.check("bias", b, db, f);
  // Without bias: y = x w exactly as with a zero bias; null dx and db skip them.
  const Vec zeros(out, 0.0);
  Vec y0(y.size()), y1(y.size());
  gpt_matmul_forward(x.data(), w.data(), static_cast<const double*>(nullptr), rows, in, out, y0.data(), 1);
  gpt_matmul_forward(x.data(), w.data(), zeros.data(), rows, in, out, y1.data(), 1);
  EXPECT_EQ(y0, y1);
  Vec dw2(w.size());
  gpt_matmul_backward(x.data(), w.data(), r.data(), rows, in, out, static_cast<double*>(nullptr), dw2.data(),
                      static_cast<double*>(nullptr), 1);
  EXPECT_EQ(dw2, dw);
}

TEST(GptOps, TiedHeadBackwardMatchesFiniteDifferences) {
  const int64_t rows = 5, c = 6, vocab_rows = 9;
  Vec x = random_vec(rows * c, 9), wte = random_vec(vocab_rows * c, 10);
  const Vec r = random_vec(rows * vocab_rows, 11);
  Vec logits(r.size());
  auto f = [&] {
    gpt_logits_forward(x.data(), wte.data(), rows, c, vocab_rows, logits.data(), 1);
    return weighted_sum(logits, r);
  };
  Vec dx(x.size()), dwte(wte.size());
  gpt_logits_backward(x.data(), wte.data(), r.data(), rows, c, vocab_rows, dx.data(), dwte.data(), 1);
  FdCheck fd("logits");
  fd.check("x", x, dx, f);
  fd.check("wte", wte, dwte, f);
}

TEST(GptOps, GeluBackwardMatchesFiniteDifferences) {
  const int64_t n = 41;
  Vec x = random_vec(n, 12, 5.0);
  const Vec r = random_vec(n, 13);
  Vec y(n);
  auto f = [&] {
    gpt_gelu_forward(x.data(), n, y.data(), 1);
    return weighted_sum(y, r);
  };
  Vec dx(n);
  gpt_gelu_backward(x.data(), r.data(), n, dx.data(), 1);
  FdCheck fd("gelu");
  fd.check("x", x, dx, f);
  // Known values of the tanh approximation.
  const Vec probe = {0.0, 1.0, -1.0, 3.0};
  Vec out(probe.size());
  gpt_gelu_forward(probe.data(), 4, out.data(), 1);
  EXPECT_EQ(out[0], 0.0);
  EXPECT_NEAR(out[1], 0.8411919906082768, 1e-15);
  EXPECT_NEAR(out[2], -0.15880800939172324, 1e-15);
  EXPECT_NEAR(out[3], 2.996362607918227, 1e-12);
}

TEST(GptOps, AttentionBackwardMatchesFiniteDifferences) {
  const int64_t batch = 2, seq = 5, c = 6, heads = 2;
  Vec qkv = random_vec(batch * seq * 3 * c, 14, 1.5);
  const Vec r = random_vec(batch * seq * c, 15);
  Vec att(batch * heads * seq * seq), out(batch * seq * c);
  auto f = [&] {
    gpt_attention_forward(qkv.data(), batch, seq, c, heads, att.data(), out.data(), 1);
    return weighted_sum(out, r);
  };
  f();
  for (int64_t p = 0; p < batch * heads; ++p) {
    for (int64_t t = 0; t < seq; ++t) {
      const double* a = att.data() + (p * seq + t) * seq;
      double sum = 0.0;
      for (int64_t t2 = 0; t2 < seq; ++t2) {
        if (t2 > t) {
          EXPECT_EQ(a[t2], 0.0) << "pair " << p << " query " << t << " key " << t2 << " is in the future";
        }
        sum += a[t2];
      }
      EXPECT_NEAR(sum, 1.0, 1e-14) << "pair " << p << " query " << t;
    }
  }
  Vec scratch(batch * heads * seq), dqkv(qkv.size(), 7.0);
  gpt_attention_backward(qkv.data(), att.data(), r.data(), batch, seq, c, heads, scratch.data(), dqkv.data(), 1);
  FdCheck fd("attention");
  fd.check("qkv", qkv, dqkv, f);
}

TEST(GptOps, SoftmaxCrossEntropyMatchesFiniteDifferencesAndIgnoresPadding) {
  const int64_t rows = 4, vocab = 5, padded = 8;
  Vec logits = random_vec(rows * padded, 16, 3.0);
  const std::vector<int32_t> targets = {0, 4, 2, 4};
  Vec row_loss(rows), dlogits(logits.size());
  auto f = [&] {
    Vec scratch(logits.size());
    return gpt_softmax_xent(logits.data(), targets.data(), rows, vocab, padded, row_loss.data(), scratch.data(), 1);
  };
  gpt_softmax_xent(logits.data(), targets.data(), rows, vocab, padded, row_loss.data(), dlogits.data(), 1);
  FdCheck fd("softmax_xent");
  fd.check("logits", logits, dlogits, f);
  for (int64_t n = 0; n < rows; ++n) {
    double sum = 0.0;
    for (int64_t v = 0; v < padded; ++v) {
      if (v >= vocab) {
        EXPECT_EQ(dlogits[static_cast<size_t>(n * padded + v)], 0.0) << "row " << n << " padded id " << v;
      }
      sum += dlogits[static_cast<size_t>(n * padded + v)];
    }
    EXPECT_NEAR(sum, 0.0, 1e-15) << "row " << n;
  }
  // A row of equal logits costs ln(vocab), whatever the padding holds.
  Vec flat(padded, 0.0);
  for (int64_t v = vocab; v < padded; ++v) flat[static_cast<size_t>(v)] = 1e3;
  Vec one_loss(1), one_grad(padded);
  EXPECT_NEAR(gpt_softmax_xent(flat.data(), targets.data(), 1, vocab, padded, one_loss.data(), one_grad.data(), 1),
              std::log(5.0), 1e-15);
}

TEST(GptOps, EmbeddingBackwardMatchesFiniteDifferences) {
  const int64_t batch = 2, seq = 4, c = 3, vocab = 5;
  const std::vector<int32_t> tokens = {1, 4, 1, 0, 4, 4, 2, 1};  // repeats: rows add up
  Vec wte = random_vec(vocab * c, 17), wpe = random_vec(seq * c, 18);
  const Vec r = random_vec(batch * seq * c, 19);
  Vec out(r.size());
  auto f = [&] {
    gpt_embedding_forward(tokens.data(), wte.data(), wpe.data(), batch, seq, c, vocab, out.data(), 1);
    return weighted_sum(out, r);
  };
  Vec dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  gpt_embedding_backward(tokens.data(), r.data(), batch, seq, c, dwte.data(), dwpe.data(), 1);
  FdCheck fd("embedding");
  fd.check("wte", wte, dwte, f);
  fd.check("wpe", wpe, dwpe, f);
  const std::vector<int32_t> bad = {0, 1, 5, 2, 0, 0, 0, 0};
  EXPECT_THROW(gpt_embedding_forward(bad.data(), wte.data(), wpe.data(), batch, seq, c, vocab, out.data(), 1),
               EnforceError);
}

TEST(GptOps, FloatGemmOpsMatchTheDoubleLoopsWithFp32AndBf16Inputs) {
  // The float GEMM ops run on gemm_cpu; the double ones are the plain loops,
  // here given the values the GEMMs see (fp32, or rounded to bf16).
  const int64_t rows = 9, in = 13, out = 21, vocab_rows = 17;
  auto f32 = [](const Vec& v) { return std::vector<float>(v.begin(), v.end()); };
  const std::vector<float> x = f32(random_vec(rows * in, 31)), w = f32(random_vec(in * out, 32)),
                           b = f32(random_vec(out, 33)), dy = f32(random_vec(rows * out, 34)),
                           wte = f32(random_vec(vocab_rows * in, 35)),
                           dlogits = f32(random_vec(rows * vocab_rows, 36));
  for (const DType inputs : {DType::kF32, DType::kBF16}) {
    std::vector<std::vector<bf16>> storage;
    storage.reserve(5);
    auto input = [&](const std::vector<float>& v) {
      if (inputs == DType::kF32) return gemm_input(v.data());
      storage.emplace_back(v.size());
      return gpt_round_to_bf16(v.data(), static_cast<int64_t>(v.size()), DType::kBF16, storage.back().data(), 1);
    };
    auto seen = [&](const std::vector<float>& v) {
      Vec r(v.begin(), v.end());
      if (inputs == DType::kBF16) {
        for (double& e : r) e = math::to_f32(math::from_f32<bf16>(static_cast<float>(e)));
      }
      return r;
    };
    const GptGemmInput xi = input(x), wi = input(w), dyi = input(dy), wtei = input(wte), dli = input(dlogits);
    const Vec xr = seen(x), wr = seen(w), dyr = seen(dy), wter = seen(wte), dlr = seen(dlogits);
    auto expect_close = [&](const std::vector<float>& got, const Vec& want, const char* what) {
      ASSERT_EQ(got.size(), want.size()) << what;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::abs(want[i])))
            << what << "[" << i << "] " << dtype_name(inputs) << " inputs";
      }
    };
    // y = x w + b (the bias stays fp32).
    std::vector<float> y(static_cast<size_t>(rows * out));
    Vec y64(y.size());
    const Vec b64(b.begin(), b.end());
    gpt_matmul_forward(xi, wi, b.data(), rows, in, out, y.data(), 1);
    gpt_matmul_forward(xr.data(), wr.data(), b64.data(), rows, in, out, y64.data(), 1);
    expect_close(y, y64, "y");
    // dx = dy w^T, dw = x^T dy; db = column sums of the fp32 dy.
    std::vector<float> dx(static_cast<size_t>(rows * in)), dw(static_cast<size_t>(in * out)), db(out);
    Vec dx64(dx.size()), dw64(dw.size()), db64(db.size(), 0.0);
    gpt_matmul_backward(xi, wi, dyi, rows, in, out, dx.data(), dw.data(), 2);
    gpt_bias_backward(dy.data(), rows, out, db.data(), 2);
    gpt_matmul_backward(xr.data(), wr.data(), dyr.data(), rows, in, out, dx64.data(), dw64.data(),
                        static_cast<double*>(nullptr), 1);
    for (int64_t n = 0; n < rows; ++n) {
      for (int64_t o = 0; o < out; ++o) db64[static_cast<size_t>(o)] += dy[static_cast<size_t>(n * out + o)];
    }
    expect_close(dx, dx64, "dx");
    expect_close(dw, dw64, "dw");
    expect_close(db, db64, "db");
    // The tied head: logits = x wte^T, dx = dlogits wte, dwte = dlogits^T x.
    std::vector<float> logits(static_cast<size_t>(rows * vocab_rows)), hdx(static_cast<size_t>(rows * in)),
        dwte(static_cast<size_t>(vocab_rows * in));
    Vec logits64(logits.size()), hdx64(hdx.size()), dwte64(dwte.size());
    gpt_logits_forward(xi, wtei, rows, in, vocab_rows, logits.data(), 2);
    gpt_logits_forward(xr.data(), wter.data(), rows, in, vocab_rows, logits64.data(), 1);
    expect_close(logits, logits64, "logits");
    gpt_logits_backward(xi, wtei, dli, rows, in, vocab_rows, hdx.data(), dwte.data(), 2);
    gpt_logits_backward(xr.data(), wter.data(), dlr.data(), rows, in, vocab_rows, hdx64.data(), dwte64.data(), 1);
    expect_close(hdx, hdx64, "head dx");
    expect_close(dwte, dwte64, "dwte");
  }
  // The float template ops are the GEMM ops with fp32 inputs.
  std::vector<float> y1(static_cast<size_t>(rows * out)), y2(y1.size());
  gpt_matmul_forward(x.data(), w.data(), b.data(), rows, in, out, y1.data(), 1);
  gpt_matmul_forward(gemm_input(x.data()), gemm_input(w.data()), b.data(), rows, in, out, y2.data(), 1);
  EXPECT_EQ(y1, y2);
}

TEST(GptOps, RoundToBf16StoresBf16OrItsFp32) {
  const std::vector<float> x = {1.0f, 1.00390625f, 1.01171875f, -3.14159265f, 0.0f, -0.0f, 1e-40f, 3.0e38f,
                                std::numeric_limits<float>::infinity(), std::nanf("")};
  std::vector<bf16> b(x.size());
  std::vector<float> f(x.size());
  const GptGemmInput ib = gpt_round_to_bf16(x.data(), static_cast<int64_t>(x.size()), DType::kBF16, b.data(), 2);
  const GptGemmInput if32 = gpt_round_to_bf16(x.data(), static_cast<int64_t>(x.size()), DType::kF32, f.data(), 2);
  EXPECT_EQ(ib.dtype, DType::kBF16);
  EXPECT_EQ(ib.data, b.data());
  EXPECT_EQ(if32.dtype, DType::kF32);
  for (size_t i = 0; i < x.size(); ++i) {
    const bf16 want = math::from_f32<bf16>(x[i]);
    EXPECT_EQ(b[i].bits, want.bits) << i;
    const float wf = math::to_f32(want);
    EXPECT_EQ(std::memcmp(&f[i], &wf, sizeof(float)), 0) << i << ": " << f[i] << " vs " << wf;
  }
  EXPECT_EQ(f[1], 1.0f);          // a tie rounds to even
  EXPECT_EQ(f[2], 1.015625f);     // above the tie rounds up
  EXPECT_THROW(gpt_round_to_bf16(x.data(), 1, DType::kF16, f.data(), 1), EnforceError);
}

// The loss with the head's bf16 gradient written directly: the bits of the
// fp32 loss then the rounding, for both storages and any thread count (each
// part computes its rows in its own scratch row).
TEST(GptOps, SoftmaxCrossEntropyBf16EqualsTheLossThenTheRounding) {
  const int64_t rows = 7, vocab = 300, padded = 320;
  std::vector<float> logits(rows * padded);
  for (size_t i = 0; i < logits.size(); ++i) {
    logits[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 6);
  }
  const std::vector<int32_t> targets = {0, 299, 5, 17, 250, 1, 100};
  std::vector<float> want_loss(rows), want_grad(rows * padded);
  const double want = gpt_softmax_xent(logits.data(), targets.data(), rows, vocab, padded, want_loss.data(),
                                       want_grad.data(), 1);
  for (DType storage : {DType::kBF16, DType::kF32}) {
    for (int threads : {1, 3}) {
      std::vector<float> loss(rows), scratch(rows * padded), out(rows * padded), want_out(rows * padded);
      gpt_round_to_bf16(want_grad.data(), rows * padded, storage, want_out.data(), 1);
      const double got = gpt_softmax_xent_bf16(logits.data(), targets.data(), rows, vocab, padded, loss.data(),
                                               scratch.data(), storage, out.data(), threads);
      const size_t bytes = static_cast<size_t>(rows * padded) * (storage == DType::kBF16 ? 2 : 4);
      EXPECT_EQ(got, want);
      EXPECT_EQ(std::memcmp(loss.data(), want_loss.data(), loss.size() * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(out.data(), want_out.data(), bytes), 0) << dtype_name(storage) << " " << threads;
    }
  }
  std::vector<float> loss(rows), scratch(rows * padded), out(rows * padded);
  std::vector<int32_t> bad = targets;
  bad[3] = vocab;
  EXPECT_THROW(gpt_softmax_xent_bf16(logits.data(), bad.data(), rows, vocab, padded, loss.data(), scratch.data(),
                                     DType::kBF16, out.data(), 1),
               EnforceError);
}

// ---- the whole model ---------------------------------------------------------

}  // namespace
}  // namespace mp

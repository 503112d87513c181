// The GPT ops (models/gpt_ops.h): every backward against central finite
// differences in double, plus the ops' own invariants.
#include "tests/gpt_test_util.h"

namespace mp {
namespace {

using namespace gpt_test;  // NOLINT(build/namespaces)

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

// ---- the whole model ---------------------------------------------------------

}  // namespace
}  // namespace mp

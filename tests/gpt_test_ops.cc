// tests/gpt_test_ops.cc: tests/gpt_test_ops.h.
#include "tests/gpt_test_ops.h"

#include <algorithm>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/layer_loops.h"
#include "kernels/cpu/layer_parts.h"
#include "kernels/cpu/loops.h"
#include "kernels/op_profile.h"

namespace mp {
namespace {
// Rows of a matmul one pass over the weights serves; columns of an output
// tile kept in L1 while the reduction dimension streams.
constexpr int64_t kRowBlock = 4;
constexpr int64_t kColTile = 512;
}  // namespace

using layer::check_token;
using layer::loops;
using layer::part_align;

// ---- matmul (Conv1D) ----------------------------------------------------------

template <class T>
void gpt_matmul_forward(const T* x, const T* w, const T* bias, int64_t rows, int64_t in, int64_t out, T* y,
                        int threads) {
  // y[n, o] = bias[o] + sum over i in order of x[n, i] w[i, o].
  parallel_for(rows, threads, part_align(in * out, kRowBlock), [&](int64_t n0, int64_t n1) {
    for (int64_t rb = n0; rb < n1; rb += kRowBlock) {
      const int64_t re = std::min(n1, rb + kRowBlock);
      for (int64_t o0 = 0; o0 < out; o0 += kColTile) {
        const int64_t on = std::min(out - o0, kColTile);
        for (int64_t n = rb; n < re; ++n) {
          T* yr = y + n * out + o0;
          if (bias != nullptr) {
            std::copy(bias + o0, bias + o0 + on, yr);
          } else {
            std::fill(yr, yr + on, T(0));
          }
        }
        for (int64_t i = 0; i < in; ++i) {
          const T* wi = w + i * out + o0;
          for (int64_t n = rb; n < re; ++n) axpy(x[n * in + i], wi, y + n * out + o0, on);
        }
      }
    }
  });
}

template <class T>
void gpt_matmul_backward(const T* x, const T* w, const T* dy, int64_t rows, int64_t in, int64_t out, T* dx, T* dw,
                         T* db, int threads) {
  if (dx != nullptr) {
    // dx[n, i] = dot(dy[n, :], w[i, :]).
    parallel_for(rows, threads, part_align(in * out, kRowBlock), [&](int64_t n0, int64_t n1) {
      for (int64_t rb = n0; rb < n1; rb += kRowBlock) {
        const int64_t re = std::min(n1, rb + kRowBlock);
        for (int64_t i = 0; i < in; ++i) {
          const T* wi = w + i * out;
          for (int64_t n = rb; n < re; ++n) dx[n * in + i] = dot(dy + n * out, wi, out);
        }
      }
    });
  }
  // dw[i, o] = sum over n in order of x[n, i] dy[n, o].
  parallel_for(in, threads, part_align(rows * out, kRowBlock), [&](int64_t i0, int64_t i1) {
    for (int64_t ib = i0; ib < i1; ib += kRowBlock) {
      const int64_t ie = std::min(i1, ib + kRowBlock);
      for (int64_t o0 = 0; o0 < out; o0 += kColTile) {
        const int64_t on = std::min(out - o0, kColTile);
        for (int64_t i = ib; i < ie; ++i) std::fill(dw + i * out + o0, dw + i * out + o0 + on, T(0));
        for (int64_t n = 0; n < rows; ++n) {
          const T* g = dy + n * out + o0;
          for (int64_t i = ib; i < ie; ++i) axpy(x[n * in + i], g, dw + i * out + o0, on);
        }
      }
    }
  });
  if (db == nullptr) return;
  parallel_for(out, threads, part_align(rows, 8), [&](int64_t o0, int64_t o1) {
    std::fill(db + o0, db + o1, T(0));
    for (int64_t n = 0; n < rows; ++n) {
      const T* g = dy + n * out;
      for (int64_t o = o0; o < o1; ++o) db[o] += g[o];
    }
  });
}

// ---- tied head ------------------------------------------------------------------

template <class T>
void gpt_logits_forward(const T* x, const T* wte, int64_t rows, int64_t channels, int64_t vocab_rows, T* logits,
                        int threads) {
  parallel_for(rows, threads, part_align(channels * vocab_rows, kRowBlock), [&](int64_t n0, int64_t n1) {
    for (int64_t rb = n0; rb < n1; rb += kRowBlock) {
      const int64_t re = std::min(n1, rb + kRowBlock);
      for (int64_t v = 0; v < vocab_rows; ++v) {
        const T* e = wte + v * channels;
        for (int64_t n = rb; n < re; ++n) logits[n * vocab_rows + v] = dot(x + n * channels, e, channels);
      }
    }
  });
}

template <class T>
void gpt_logits_backward(const T* x, const T* wte, const T* dlogits, int64_t rows, int64_t channels, int64_t vocab_rows,
                         T* dx, T* dwte, int threads) {
  // dx[n, :] = sum over v in order of dlogits[n, v] wte[v, :].
  if (dx != nullptr) {
    parallel_for(rows, threads, part_align(channels * vocab_rows, kRowBlock), [&](int64_t n0, int64_t n1) {
      for (int64_t rb = n0; rb < n1; rb += kRowBlock) {
        const int64_t re = std::min(n1, rb + kRowBlock);
        std::fill(dx + rb * channels, dx + re * channels, T(0));
        for (int64_t v = 0; v < vocab_rows; ++v) {
          const T* e = wte + v * channels;
          for (int64_t n = rb; n < re; ++n) axpy(dlogits[n * vocab_rows + v], e, dx + n * channels, channels);
        }
      }
    });
  }
  // dwte[v, :] = sum over n in order of dlogits[n, v] x[n, :].
  if (dwte != nullptr) {
    parallel_for(vocab_rows, threads, part_align(channels * rows, kRowBlock), [&](int64_t v0, int64_t v1) {
      for (int64_t vb = v0; vb < v1; vb += kRowBlock) {
        const int64_t ve = std::min(v1, vb + kRowBlock);
        std::fill(dwte + vb * channels, dwte + ve * channels, T(0));
        for (int64_t n = 0; n < rows; ++n) {
          const T* xr = x + n * channels;
          for (int64_t v = vb; v < ve; ++v) axpy(dlogits[n * vocab_rows + v], xr, dwte + v * channels, channels);
        }
      }
    });
  }
}

// ---- GEMM ops (float path) --------------------------------------------------------

namespace {

GemmInput stored(GptGemmInput x, int64_t ld, bool transposed) { return GemmInput{x.data, x.dtype, ld, transposed}; }

// C[m, n] (ldc n) = op(a) op(b) (+ bias).
void gemm(int64_t m, int64_t n, int64_t k, GemmInput a, GemmInput b, const float* bias, float* c, int threads) {
  GemmOptions o;
  o.threads = threads;
  gemm_cpu(gemm_problem(m, n, k, a, b, c, bias), o);
}

}  // namespace

void gpt_matmul_forward(GptGemmInput x, GptGemmInput w, const float* bias, int64_t rows, int64_t in, int64_t out,
                        float* y, int threads) {
  gemm(rows, out, in, stored(x, in, false), stored(w, out, false), bias, y, threads);
}

void gpt_matmul_backward(GptGemmInput x, GptGemmInput w, GptGemmInput dy, int64_t rows, int64_t in, int64_t out,
                         float* dx, float* dw, int threads) {
  // dx[rows, in] = dy[rows, out] w^T (w stored [in, out]).
  if (dx != nullptr) gemm(rows, in, out, stored(dy, out, false), stored(w, out, true), nullptr, dx, threads);
  // dw[in, out] = x^T (x stored [rows, in]) dy[rows, out].
  gemm(in, out, rows, stored(x, in, true), stored(dy, out, false), nullptr, dw, threads);
}

void gpt_bias_backward(const float* dy, int64_t rows, int64_t out, float* db, int threads) {
  ScopedOp op(OpFamily::kElementwise);
  parallel_for(out, threads, part_align(rows, 8),
               [&](int64_t o0, int64_t o1) { layer_loops().bias_grad(dy, rows, out, db, o0, o1); });
}

void gpt_logits_forward(GptGemmInput x, GptGemmInput wte, int64_t rows, int64_t channels, int64_t vocab_rows,
                        float* logits, int threads) {
  // logits[rows, V] = x[rows, C] wte^T (wte stored [V, C]).
  gemm(rows, vocab_rows, channels, stored(x, channels, false), stored(wte, channels, true), nullptr, logits, threads);
}

void gpt_logits_backward(GptGemmInput x, GptGemmInput wte, GptGemmInput dlogits, int64_t rows, int64_t channels,
                         int64_t vocab_rows, float* dx, float* dwte, int threads) {
  // dx[rows, C] = dlogits[rows, V] wte[V, C].
  if (dx != nullptr) {
    gemm(rows, channels, vocab_rows, stored(dlogits, vocab_rows, false), stored(wte, channels, false), nullptr, dx,
         threads);
  }
  // dwte[V, C] = dlogits^T (stored [rows, V]) x[rows, C].
  if (dwte != nullptr) {
    gemm(vocab_rows, channels, rows, stored(dlogits, vocab_rows, true), stored(x, channels, false), nullptr, dwte,
         threads);
  }
}

template <>
void gpt_matmul_forward<float>(const float* x, const float* w, const float* bias, int64_t rows, int64_t in, int64_t out,
                               float* y, int threads) {
  gpt_matmul_forward(gemm_input(x), gemm_input(w), bias, rows, in, out, y, threads);
}

template <>
void gpt_matmul_backward<float>(const float* x, const float* w, const float* dy, int64_t rows, int64_t in, int64_t out,
                                float* dx, float* dw, float* db, int threads) {
  gpt_matmul_backward(gemm_input(x), gemm_input(w), gemm_input(dy), rows, in, out, dx, dw, threads);
  if (db != nullptr) gpt_bias_backward(dy, rows, out, db, threads);
}

template <>
void gpt_logits_forward<float>(const float* x, const float* wte, int64_t rows, int64_t channels, int64_t vocab_rows,
                               float* logits, int threads) {
  gpt_logits_forward(gemm_input(x), gemm_input(wte), rows, channels, vocab_rows, logits, threads);
}

template <>
void gpt_logits_backward<float>(const float* x, const float* wte, const float* dlogits, int64_t rows, int64_t channels,
                                int64_t vocab_rows, float* dx, float* dwte, int threads) {
  gpt_logits_backward(gemm_input(x), gemm_input(wte), gemm_input(dlogits), rows, channels, vocab_rows, dx, dwte,
                      threads);
}

// The loops of the GEMM ops, for the double path (float has the
// specializations above).
template void gpt_matmul_forward<double>(const double*, const double*, const double*, int64_t, int64_t, int64_t,
                                         double*, int);
template void gpt_matmul_backward<double>(const double*, const double*, const double*, int64_t, int64_t, int64_t,
                                          double*, double*, double*, int);
template void gpt_logits_forward<double>(const double*, const double*, int64_t, int64_t, int64_t, double*, int);
template void gpt_logits_backward<double>(const double*, const double*, const double*, int64_t, int64_t, int64_t,
                                          double*, double*, int);


// ---- gelu -----------------------------------------------------------------------
// The per-element math lives in kernels/gpt_math.h, shared with the CUDA kernels.

template <class T>
void gpt_gelu_forward(const T* x, int64_t n, T* out, int threads) {
  ScopedOp op(OpFamily::kGelu);
  parallel_for(n, threads, part_align(32, 16),
               [&](int64_t j0, int64_t j1) { loops<T>().gelu_forward(x, out, j0, j1); });
}

template <class T>
void gpt_gelu_backward(const T* x, const T* dout, int64_t n, T* dx, int threads) {
  ScopedOp op(OpFamily::kGelu);
  parallel_for(n, threads, part_align(32, 16),
               [&](int64_t j0, int64_t j1) { loops<T>().gelu_backward(x, dout, dx, j0, j1); });
}

// ---- residual -------------------------------------------------------------------

template <class T>
void gpt_add(const T* a, const T* b, int64_t n, T* out, int threads) {
  ScopedOp op(OpFamily::kElementwise);
  parallel_for(n, threads, part_align(1, 16), [&](int64_t j0, int64_t j1) { loops<T>().add(a, b, out, j0, j1); });
}

namespace {
// The mean of the rows' losses, summed in double in row order.
template <class T>
double mean_row_loss(const T* row_loss, int64_t rows) {
  double total = 0.0;
  for (int64_t n = 0; n < rows; ++n) total += static_cast<double>(row_loss[n]);
  return total / static_cast<double>(rows);
}
}  // namespace

// ---- loss -----------------------------------------------------------------------

template <class T>
double gpt_softmax_xent(const T* logits, const int32_t* targets, int64_t rows, int64_t vocab, int64_t padded_vocab,
                        T* row_loss, T* dlogits, int threads) {
  ScopedOp op(OpFamily::kSoftmaxXent);
  MP_ENFORCE(vocab > 0 && vocab <= padded_vocab, "vocab ", vocab, " with padded vocab ", padded_vocab);
  for (int64_t n = 0; n < rows; ++n) check_token(targets[n], vocab, n, "target");
  const SoftmaxXentLoopArgs<T> a{logits, targets, vocab, padded_vocab, T(1) / static_cast<T>(rows), row_loss, dlogits};
  parallel_for(rows, threads, part_align(8 * vocab, 1),
               [&](int64_t n0, int64_t n1) { loops<T>().softmax_xent(a, n0, n1); });
  return mean_row_loss(row_loss, rows);
}

double gpt_softmax_xent_bf16(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                             int64_t padded_vocab, float* row_loss, float* dlogits, DType storage, void* dlogits16,
                             int threads) {
  gpt_softmax_xent_rows(logits, targets, rows, vocab, padded_vocab, rows, row_loss, dlogits, storage, dlogits16,
                        threads);
  return mean_row_loss(row_loss, rows);
}

void gpt_softmax_xent_rows(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                           int64_t padded_vocab, int64_t loss_rows, float* row_loss, float* dlogits, DType storage,
                           void* dlogits16, int threads) {
  ScopedOp op(OpFamily::kSoftmaxXent);
  MP_ENFORCE(vocab > 0 && vocab <= padded_vocab, "vocab ", vocab, " with padded vocab ", padded_vocab);
  MP_ENFORCE(rows <= loss_rows, "a chunk of ", rows, " rows of a loss over ", loss_rows);
  MP_ENFORCE(storage == DType::kBF16 || storage == DType::kF32, "bf16 values stored as ", dtype_name(storage));
  for (int64_t n = 0; n < rows; ++n) check_token(targets[n], vocab, n, "target");
  const SoftmaxXentLoopArgs<float> a{logits,   targets, vocab,     padded_vocab, 1.0f / static_cast<float>(loss_rows),
                                     row_loss, dlogits, dlogits16, storage};
  parallel_for(rows, threads, part_align(8 * vocab, 1),
               [&](int64_t n0, int64_t n1) { layer_loops().softmax_xent(a, n0, n1); });
}

// ---- causal self-attention ------------------------------------------------------

template <class T>
void gpt_attention_forward(const T* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads, T* att, T* out,
                           int threads) {
  ScopedOp op(OpFamily::kAttention);
  MP_ENFORCE(heads > 0 && channels % heads == 0, heads, " heads do not divide ", channels, " channels");
  const AttentionLoopArgs<T> a{qkv, nullptr, nullptr, seq, channels, heads, att, out, nullptr, nullptr};
  parallel_for(batch * heads, threads, part_align(seq * seq * channels / heads, 1),
               [&](int64_t p0, int64_t p1) { loops<T>().attention_forward(a, p0, p1); });
}

template <class T>
void gpt_attention_backward(const T* qkv, const T* att, const T* dout, int64_t batch, int64_t seq, int64_t channels,
                            int64_t heads, T* scratch, T* dqkv, int threads) {
  ScopedOp op(OpFamily::kAttention);
  MP_ENFORCE(heads > 0 && channels % heads == 0, heads, " heads do not divide ", channels, " channels");
  const AttentionLoopArgs<T> a{qkv, att, dout, seq, channels, heads, nullptr, nullptr, scratch, dqkv};
  parallel_for(batch * heads, threads, part_align(2 * seq * seq * channels / heads, 1),
               [&](int64_t p0, int64_t p1) { loops<T>().attention_backward(a, p0, p1); });
}

// ---- layernorm ----------------------------------------------------------------

template <class T>
void gpt_layernorm_forward(const T* x, const T* w, const T* b, int64_t rows, int64_t channels, T* out, T* mean, T* rstd,
                           int threads) {
  ScopedOp op(OpFamily::kLayerNorm);
  const LayerNormLoopArgs<T> a{x, w, b, channels, out, mean, rstd};
  parallel_for(rows, threads, part_align(3 * channels, 1),
               [&](int64_t n0, int64_t n1) { loops<T>().layernorm_forward(a, n0, n1); });
}

template <class T>
void gpt_layernorm_backward(const T* dout, const T* x, const T* w, const T* mean, const T* rstd, int64_t rows,
                            int64_t channels, T* dx, T* dw, T* db, int threads) {
  ScopedOp op(OpFamily::kLayerNorm);
  const LayerNormGradLoopArgs<T> a{dout, x, w, mean, rstd, rows, channels, dx, dw, db};
  parallel_for(rows, threads, part_align(4 * channels, 1),
               [&](int64_t n0, int64_t n1) { loops<T>().layernorm_grad_input(a, n0, n1); });
  parallel_for(channels, threads, part_align(2 * rows, 8),
               [&](int64_t c0, int64_t c1) { loops<T>().layernorm_grad_params(a, c0, c1); });
}

#define MP_INSTANTIATE(T)                                                                                             \
  template void gpt_gelu_forward<T>(const T*, int64_t, T*, int);                                                      \
  template void gpt_gelu_backward<T>(const T*, const T*, int64_t, T*, int);                                           \
  template void gpt_add<T>(const T*, const T*, int64_t, T*, int);                                                     \
  template double gpt_softmax_xent<T>(const T*, const int32_t*, int64_t, int64_t, int64_t, T*, T*, int);              \
  template void gpt_attention_forward<T>(const T*, int64_t, int64_t, int64_t, int64_t, T*, T*, int);                  \
  template void gpt_attention_backward<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, T*, T*,   \
                                          int);                                                                       \
  template void gpt_layernorm_forward<T>(const T*, const T*, const T*, int64_t, int64_t, T*, T*, T*, int);            \
  template void gpt_layernorm_backward<T>(const T*, const T*, const T*, const T*, const T*, int64_t, int64_t, T*, T*, \
                                          T*, int);

MP_INSTANTIATE(float)
MP_INSTANTIATE(double)
#undef MP_INSTANTIATE

}  // namespace mp

// models/gpt_ops.h: the GPT-2 layer math on the CPU, written once as
// templates over the scalar T (float for the model, double for reference
// tests; both are instantiated in gpt_ops.cc).
//
// Note [GPT op math]
// Activations are row-major with one row per token position: rows = batch *
// seq, row n = b * seq + t. Weights follow the Hugging Face GPT-2 Conv1D
// layout [in, out] (y = x w + bias), except the tied head, which reads wte as
// [vocab rows, channels] (logits = x wte^T).
// Every output element is computed by exactly one thread, in an order that
// depends only on the shapes, never on how parallel_for splits the work; so
// results are bitwise identical for any thread count. Reductions use fixed
// per-lane partial sums (see `dot` in gpt_ops.cc) so they vectorize without
// reassociation.
// Gradients overwrite their outputs, except where a function says
// "accumulates": the residual-stream input gradient of layernorm_backward
// and the embedding tables of embedding_backward, which are sums of several
// contributions in the model (the residual branch; the tied head).
#pragma once

#include <cstdint>

namespace mp {

inline constexpr double kGptLayerNormEps = 1e-5;

// ---- embedding --------------------------------------------------------------
// out[n, :] = wte[tokens[n], :] + wpe[n % seq, :]. wte has vocab_rows rows;
// every token must lie in [0, vocab_rows) (EnforceError otherwise).
template <class T>
void gpt_embedding_forward(const int32_t* tokens, const T* wte, const T* wpe, int64_t batch, int64_t seq,
                           int64_t channels, int64_t vocab_rows, T* out, int threads);

// Accumulates: dwte[tokens[n], :] += dout[n, :] and dwpe[n % seq, :] +=
// dout[n, :], over n in increasing order.
template <class T>
void gpt_embedding_backward(const int32_t* tokens, const T* dout, int64_t batch, int64_t seq, int64_t channels,
                            T* dwte, T* dwpe, int threads);

// ---- layernorm ----------------------------------------------------------------
// out = (x - mean) * rstd * w + b per row, rstd = 1 / sqrt(var + eps) with the
// biased variance; mean and rstd ([rows]) are saved for the backward.
template <class T>
void gpt_layernorm_forward(const T* x, const T* w, const T* b, int64_t rows, int64_t channels, T* out, T* mean,
                           T* rstd, int threads);

// Accumulates the input gradient into dx (dx += d loss / d x); overwrites dw
// and db.
template <class T>
void gpt_layernorm_backward(const T* dout, const T* x, const T* w, const T* mean, const T* rstd, int64_t rows,
                            int64_t channels, T* dx, T* dw, T* db, int threads);

// ---- matmul (Conv1D) ----------------------------------------------------------
// y[rows, out] = x[rows, in] w[in, out] + bias[out]; bias may be null.
template <class T>
void gpt_matmul_forward(const T* x, const T* w, const T* bias, int64_t rows, int64_t in, int64_t out, T* y,
                        int threads);

// Overwrites dx = dy w^T (skipped if dx is null), dw = x^T dy and db =
// column sums of dy (skipped if db is null).
template <class T>
void gpt_matmul_backward(const T* x, const T* w, const T* dy, int64_t rows, int64_t in, int64_t out, T* dx,
                         T* dw, T* db, int threads);

// ---- tied head ------------------------------------------------------------------
// logits[rows, vocab_rows] = x[rows, channels] wte^T, wte [vocab_rows, channels].
template <class T>
void gpt_logits_forward(const T* x, const T* wte, int64_t rows, int64_t channels, int64_t vocab_rows, T* logits,
                        int threads);

// Overwrites dx = dlogits wte and dwte = dlogits^T x.
template <class T>
void gpt_logits_backward(const T* x, const T* wte, const T* dlogits, int64_t rows, int64_t channels,
                         int64_t vocab_rows, T* dx, T* dwte, int threads);

// ---- gelu -----------------------------------------------------------------------
// The tanh approximation of GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class T>
void gpt_gelu_forward(const T* x, int64_t n, T* out, int threads);

// dx = dout * gelu'(x); dx may alias dout.
template <class T>
void gpt_gelu_backward(const T* x, const T* dout, int64_t n, T* dx, int threads);

// ---- causal self-attention ------------------------------------------------------
// qkv [rows, 3 channels]: row n holds q | k | v, head h at columns
// h * head_dim .. of each third (head_dim = channels / heads). att [batch,
// heads, seq, seq] := the softmax probabilities, softmax(q k^T / sqrt(head_dim))
// over keys t2 <= t (zero above the diagonal); out [rows, channels] :=
// att v, heads side by side.
template <class T>
void gpt_attention_forward(const T* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads, T* att,
                           T* out, int threads);

// Overwrites dqkv [rows, 3 channels]. scratch: batch * heads * seq elements.
template <class T>
void gpt_attention_backward(const T* qkv, const T* att, const T* dout, int64_t batch, int64_t seq,
                            int64_t channels, int64_t heads, T* scratch, T* dqkv, int threads);

// ---- loss -----------------------------------------------------------------------
// Mean over rows of the cross-entropy of softmax(logits[n, 0 .. vocab)) at
// targets[n]; logits rows have stride padded_vocab >= vocab and the columns
// past vocab are ignored (llm.c's padded vocabulary). Overwrites dlogits
// [rows, padded_vocab] with the gradient of the mean (zero on the padding)
// and row_loss [rows] with each row's loss; the mean is summed in double in
// row order.
template <class T>
double gpt_softmax_xent(const T* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                        int64_t padded_vocab, T* row_loss, T* dlogits, int threads);

// ---- residual -------------------------------------------------------------------
// out = a + b elementwise; out may alias a or b.
template <class T>
void gpt_add(const T* a, const T* b, int64_t n, T* out, int threads);

}  // namespace mp

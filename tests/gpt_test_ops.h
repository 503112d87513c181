// tests/gpt_test_ops.h: the GPT's layer ops on the CPU that only the tests call (the models run kernels/nn/ over
// kernels/cpu/ and kernels/cuda/): the Conv1D matmul, the tied head and their GEMMs, GELU, the residual add,
// attention and LayerNorm on plain arrays, and the cross-entropy loss. Templates over T (the double path keeps the
// plain loops: the reference the float path is tested against); the GEMMs' float path on oneDNN (gemm_cpu,
// kernels/cpu/gemm.h) with fp32 or bf16 inputs.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/matmul.h"

namespace mp {

// ---- matmul (Conv1D) ----------------------------------------------------------
// y[rows, out] = x[rows, in] w[in, out] + bias[out]; bias may be null.
template <class T>
void gpt_matmul_forward(const T* x, const T* w, const T* bias, int64_t rows, int64_t in, int64_t out, T* y,
                        int threads);

// Overwrites dx = dy w^T (skipped if dx is null), dw = x^T dy and db =
// column sums of dy (skipped if db is null).
template <class T>
void gpt_matmul_backward(const T* x, const T* w, const T* dy, int64_t rows, int64_t in, int64_t out, T* dx, T* dw,
                         T* db, int threads);

// ---- tied head ------------------------------------------------------------------
// logits[rows, vocab_rows] = x[rows, channels] wte^T, wte [vocab_rows, channels].
template <class T>
void gpt_logits_forward(const T* x, const T* wte, int64_t rows, int64_t channels, int64_t vocab_rows, T* logits,
                        int threads);

// Overwrites dx = dlogits wte and dwte = dlogits^T x; either may be null
// (skipped).
template <class T>
void gpt_logits_backward(const T* x, const T* wte, const T* dlogits, int64_t rows, int64_t channels, int64_t vocab_rows,
                         T* dx, T* dwte, int threads);

// The float instantiations are the GEMM ops below with fp32 inputs.
template <>
void gpt_matmul_forward<float>(const float* x, const float* w, const float* bias, int64_t rows, int64_t in, int64_t out,
                               float* y, int threads);
template <>
void gpt_matmul_backward<float>(const float* x, const float* w, const float* dy, int64_t rows, int64_t in, int64_t out,
                                float* dx, float* dw, float* db, int threads);
template <>
void gpt_logits_forward<float>(const float* x, const float* wte, int64_t rows, int64_t channels, int64_t vocab_rows,
                               float* logits, int threads);
template <>
void gpt_logits_backward<float>(const float* x, const float* wte, const float* dlogits, int64_t rows, int64_t channels,
                                int64_t vocab_rows, float* dx, float* dwte, int threads);

// ---- GEMM ops with fp32 or bf16 inputs (float path) -----------------------------
// The same products as above, on gemm_cpu: every input is fp32 or bf16
// values (`dtype`), accumulated and written in fp32 (Note [GPT autocast] in
// models/gpt.h says which op gets which).
inline GptGemmInput gemm_input(const float* values) { return GptGemmInput{values, DType::kF32}; }
// y = x w + bias (bias fp32, may be null).
void gpt_matmul_forward(GptGemmInput x, GptGemmInput w, const float* bias, int64_t rows, int64_t in, int64_t out,
                        float* y, int threads);
// dx = dy w^T (skipped if dx is null) and dw = x^T dy. The bias gradient
// is gpt_bias_backward of the fp32 dy.
void gpt_matmul_backward(GptGemmInput x, GptGemmInput w, GptGemmInput dy, int64_t rows, int64_t in, int64_t out,
                         float* dx, float* dw, int threads);
// db[out] = column sums of dy[rows, out], summed over rows in order.
void gpt_bias_backward(const float* dy, int64_t rows, int64_t out, float* db, int threads);
// logits = x wte^T.
void gpt_logits_forward(GptGemmInput x, GptGemmInput wte, int64_t rows, int64_t channels, int64_t vocab_rows,
                        float* logits, int threads);
// dx = dlogits wte and dwte = dlogits^T x; either may be null (skipped).
void gpt_logits_backward(GptGemmInput x, GptGemmInput wte, GptGemmInput dlogits, int64_t rows, int64_t channels,
                         int64_t vocab_rows, float* dx, float* dwte, int threads);

// ---- gelu -----------------------------------------------------------------------
// The tanh approximation of GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class T>
void gpt_gelu_forward(const T* x, int64_t n, T* out, int threads);

// dx = dout * gelu'(x); dx may alias dout.
template <class T>
void gpt_gelu_backward(const T* x, const T* dout, int64_t n, T* dx, int threads);

// ---- residual -------------------------------------------------------------------
// out = a + b elementwise; out may alias a or b.
template <class T>
void gpt_add(const T* a, const T* b, int64_t n, T* out, int threads);

// ---- causal self-attention ------------------------------------------------------
// qkv [rows, 3 channels]: row n holds q | k | v, head h at columns
// h * head_dim .. of each third (head_dim = channels / heads). att [batch,
// heads, seq, seq] := the softmax probabilities, softmax(q k^T / sqrt(head_dim))
// over keys t2 <= t (zero above the diagonal); out [rows, channels] :=
// att v, heads side by side.
template <class T>
void gpt_attention_forward(const T* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads, T* att, T* out,
                           int threads);

// Overwrites dqkv [rows, 3 channels]. scratch: batch * heads * seq elements.
template <class T>
void gpt_attention_backward(const T* qkv, const T* att, const T* dout, int64_t batch, int64_t seq, int64_t channels,
                            int64_t heads, T* scratch, T* dqkv, int threads);

// ---- layernorm ----------------------------------------------------------------
// out = (x - mean) * rstd * w + b per row, rstd = 1 / sqrt(var + eps) with the
// biased variance; mean and rstd ([rows]) are saved for the backward.
template <class T>
void gpt_layernorm_forward(const T* x, const T* w, const T* b, int64_t rows, int64_t channels, T* out, T* mean, T* rstd,
                           int threads);

// Accumulates the input gradient into dx (dx += d loss / d x); overwrites dw
// and db.
template <class T>
void gpt_layernorm_backward(const T* dout, const T* x, const T* w, const T* mean, const T* rstd, int64_t rows,
                            int64_t channels, T* dx, T* dw, T* db, int threads);

// ---- loss -----------------------------------------------------------------------
// Mean over rows of the cross-entropy of softmax(logits[n, 0 .. vocab)) at
// targets[n]; logits rows have stride padded_vocab >= vocab and the columns
// past vocab are ignored (llm.c's padded vocabulary). Overwrites dlogits
// [rows, padded_vocab] with the gradient of the mean (zero on the padding)
// and row_loss [rows] with each row's loss; the mean is summed in double in
// row order.
template <class T>
double gpt_softmax_xent(const T* logits, const int32_t* targets, int64_t rows, int64_t vocab, int64_t padded_vocab,
                        T* row_loss, T* dlogits, int threads);

// The float loss with the bf16 GEMM input of the head's backward: the same
// loss, row_loss and gradient values, the gradient written only rounded to
// bf16 into dlogits16 (storage kBF16, or kF32 holding the bf16 values):
// the bits of gpt_softmax_xent then gpt_round_to_bf16, without the fp32
// gradient's round trip through memory. dlogits [rows, padded_vocab] is
// scratch (left unspecified). Returns the mean loss.
double gpt_softmax_xent_bf16(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                             int64_t padded_vocab, float* row_loss, float* dlogits, DType storage, void* dlogits16,
                             int threads);

// A chunk of the float loss: rows [0, rows) of a loss over loss_rows >=
// rows rows, so dlogits := (softmax - onehot) / loss_rows, and row_loss as
// above. Without dlogits16 (null) the gradient is written to dlogits, which
// may be logits itself (in place); with it, as in gpt_softmax_xent_bf16,
// only its bf16 rounding goes to dlogits16 and dlogits is scratch (one row
// per thread, which may also be logits). With loss_rows = rows: the bits
// of gpt_softmax_xent / gpt_softmax_xent_bf16.
void gpt_softmax_xent_rows(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                           int64_t padded_vocab, int64_t loss_rows, float* row_loss, float* dlogits, DType storage,
                           void* dlogits16, int threads);

}  // namespace mp

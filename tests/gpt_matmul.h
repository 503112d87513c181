// tests/gpt_matmul.h: the Conv1D matmul, the tied head and their GEMMs on the CPU, as the GPT tests compute them: the
// template over T (the double path keeps the plain loops, the reference the float path is tested against) and the
// float path on oneDNN (gemm_cpu, kernels/cpu/gemm.h) with fp32 or bf16 inputs.
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

}  // namespace mp

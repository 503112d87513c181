// kernels/cpu/gpt_act_ops.h: the float path's GPT ops on activations that
// may hold bf16 values (kernels/act.h): the CPU bodies of the LayerNorm,
// attention and classifier ops of kernels/nn/. Each reads its bf16 inputs
// widened exactly, computes as the float ops of kernels/cpu/gpt_ops.h do
// (the same loops, so the same bits for the same fp32 values), and rounds
// its outputs to bf16 (nearest even) where they hold bf16 values, in the
// same pass (kernels/cpu/gpt_loops.h). So an Act of fp32 values gives the
// bits of the plain float op, and bf16 activations are rounded at the same
// points as on a GPU (Note [GPT activations] in models/gpt.h).
//
// `scratch` is fp32 the caller owns, at least the op's *_scratch_elements.
#pragma once

#include <cstdint>

#include "kernels/act.h"

namespace mp {

// ---- layernorm -------------------------------------------------------------------
int64_t gpt_layernorm_act_scratch_elements(int64_t rows, int64_t channels);

// out := the LayerNorm of x [rows, channels] (fp32) with w, b; mean, rstd [rows].
void gpt_layernorm_forward(const float* x, const float* w, const float* b, int64_t rows, int64_t channels, Act out,
                           float* mean, float* rstd, float* scratch, int threads);

// From dout (the output's gradient, stored as the output was): dx (fp32
// [rows, channels]) := dx + d loss / d x (accumulate) or d loss / d x;
// with dx_copy.data, dx_copy := that dx as dx_copy stores it (rounded to
// bf16: the next bf16 GEMM's input). dw, db overwritten.
void gpt_layernorm_backward(Act dout, const float* x, const float* w, const float* mean, const float* rstd,
                            int64_t rows, int64_t channels, float* dx, bool accumulate, Act dx_copy, float* dw,
                            float* db, float* scratch, int threads);

// ---- causal self-attention ----------------------------------------------------------
// The layouts of gpt_attention_forward in kernels/cpu/gpt_ops.h: qkv [rows,
// 3 C], out [rows, C], att [batch, heads, seq, seq] (fp32, the saved
// probabilities). The backward's scratch: batch * heads * seq.
int64_t gpt_attention_act_scratch_elements(int64_t batch, int64_t seq, int64_t channels, int64_t heads);

void gpt_attention_forward(Act qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads, float* att, Act out,
                           float* scratch, int threads);

// Overwrites dqkv [rows, 3 C].
void gpt_attention_backward(Act qkv, const float* att, Act dout, int64_t batch, int64_t seq, int64_t channels,
                            int64_t heads, Act dqkv, float* scratch, int threads);

// ---- classifier -------------------------------------------------------------------
// Rows [0, rows) of a loss over loss_rows >= rows rows, in place: reads the
// logits [rows, padded_vocab] (columns past vocab ignored), row_loss[n] :=
// row n's cross-entropy at targets[n], and overwrites the logits with d
// logits = (softmax - onehot) / loss_rows (zero on the padding), stored as
// the logits were. A target outside [0, vocab) throws EnforceError before
// anything is written.
void gpt_classifier(Act logits, const int32_t* targets, int64_t rows, int64_t vocab, int64_t padded_vocab,
                    int64_t loss_rows, float* row_loss, int threads);

// ---- casts ------------------------------------------------------------------------
// dst := src (n values): widened exactly, rounded to bf16 where dst holds
// bf16 values, or copied.
void gpt_convert(Act src, Act dst, int64_t n, int threads);

}  // namespace mp

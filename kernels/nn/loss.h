// kernels/nn/loss.h: the fused classifier of a GPT: softmax cross-entropy
// over a (padded) vocabulary as ops on a stream (Note [Op dispatch] in
// kernels/dispatch.h), a chunk of rows at a time. The logits are an
// activation (kernels/act.h: fp32, or bf16 values in the bf16 recipes)
// that the op overwrites with their gradient, so no fp32 logits,
// probabilities or gradient are ever stored beside them. Logits rows have
// stride padded_vocab >= vocab; the padding columns are ignored and get
// zero gradient (llm.c's padded vocabulary).
#pragma once

#include <cstdint>

#include "kernels/act.h"
#include "kernels/dispatch.h"

namespace mp::nn {

// Rows [0, rows) of a loss over loss_rows >= rows rows: row_loss [rows] :=
// each row's cross-entropy at its target (max, sum of exp and loss in
// fp32), and the logits := d logits = (softmax - onehot) / loss_rows, in
// place, stored as the logits were (rounded to bf16 where they hold bf16
// values). A target outside [0, vocab) fails the op (CPU) or gives NaN in
// its row's loss and gradient (CUDA).
void classifier(const OpContext& cx, Act logits, const int32_t* targets, int64_t rows, int64_t vocab,
                int64_t padded_vocab, int64_t loss_rows, float* row_loss);

// *mean (device memory) := the mean of row_loss [rows > 0], summed in
// double (in row order on the CPU, in a fixed tree order on a GPU).
void mean_loss(const OpContext& cx, const float* row_loss, int64_t rows, double* mean);

}  // namespace mp::nn

// kernels/nn/loss.h: softmax cross-entropy over a (padded) vocabulary as
// ops on a stream (Note [Op dispatch] in kernels/dispatch.h), a chunk of
// rows at a time so that a model never needs all the logits at once.
// Logits rows have stride padded_vocab >= vocab; the padding columns are
// ignored and get zero gradient (llm.c's padded vocabulary).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/dispatch.h"

namespace mp::nn {

// Rows [0, rows) of a loss over loss_rows >= rows rows: row_loss [rows] :=
// each row's cross-entropy at its target, and d logits := (softmax -
// onehot) / loss_rows, into dlogits [rows, padded_vocab], which may be
// logits itself (in place). With dlogits16 (non-null) the gradient is
// written only rounded to bf16 into dlogits16 (stored as `storage`,
// nn::bf16_storage), and dlogits is scratch. A target outside [0, vocab)
// fails the op (CPU) or gives NaN (CUDA).
void softmax_xent(const OpContext& cx, const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                  int64_t padded_vocab, int64_t loss_rows, float* row_loss, float* dlogits, DType storage,
                  void* dlogits16);

// *mean (device memory) := the mean of row_loss [rows > 0], summed in
// double (in row order on the CPU, in a fixed tree order on a GPU).
void mean_loss(const OpContext& cx, const float* row_loss, int64_t rows, double* mean);

}  // namespace mp::nn

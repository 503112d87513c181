// kernels/cpu/loss.h: the mean loss and the fused classifier on logits that may hold bf16 (kernels/act.h) on the CPU
// (Note [Layer ops on the CPU] in kernels/cpu/layer_parts.h; the tests' cross-entropy loss is tests/gpt_test_ops.h).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/act.h"

namespace mp {

// ---- loss -----------------------------------------------------------------------
// The mean of row_loss [rows > 0], summed in double in row order (the
// loss's value).
double gpt_mean_loss(const float* row_loss, int64_t rows);

// ---- classifier -------------------------------------------------------------------
// Rows [0, rows) of a loss over loss_rows >= rows rows, in place: reads the
// logits [rows, padded_vocab] (columns past vocab ignored), row_loss[n] :=
// row n's cross-entropy at targets[n], and overwrites the logits with d
// logits = (softmax - onehot) / loss_rows (zero on the padding), stored as
// the logits were. A target outside [0, vocab) throws EnforceError before
// anything is written.
void gpt_classifier(Act logits, const int32_t* targets, int64_t rows, int64_t vocab, int64_t padded_vocab,
                    int64_t loss_rows, float* row_loss, int threads);

}  // namespace mp

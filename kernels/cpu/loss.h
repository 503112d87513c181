// kernels/cpu/loss.h: the cross-entropy loss and the fused classifier on the CPU (Note [Layer ops on the CPU] in
// kernels/cpu/layer_parts.h): the template over T, the float rows, and the classifier on logits that may hold bf16
// (kernels/act.h).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/act.h"

namespace mp {

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

// The mean of row_loss [rows > 0], summed in double in row order: what the
// two functions above return.
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

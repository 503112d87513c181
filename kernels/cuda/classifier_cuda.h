// kernels/cuda/classifier_cuda.h: the fused classifier on a CUDA device, the
// CUDA body of kernels/nn/loss.h (the CPU's is kernels/cpu/loss.h):
// per row of logits, in one kernel, the max and the sum of exp (online, one
// pass), the loss, and the gradient written over the logits in place, in
// their dtype (kernels/act.h). No fp32 logits, probabilities or gradient
// are stored.
//
// Note [Classifier kernel]
// - One block per row, rows walked from the last (the GEMM that reads the
//   gradient next starts where this kernel ended, in L2). Two reads of the
//   row (the statistics, then the gradient) and one write, 16 bytes per
//   access where the row allows (padded_vocab a multiple of 8, 16-byte
//   aligned), else one element per access.
// - The statistics: each thread keeps a running max and a sum of exp
//   rescaled to it over its elements; the block combines them in a fixed
//   tree. The exp is math::gpt_exp (kernels/gpt_math.h), as on the CPU;
//   the loss is log(sum) + max - logit[target], the gradient
//   exp(logit - max) / sum / loss_rows, minus 1 / loss_rows at the target,
//   0 on the padding.
// - A target outside [0, vocab) makes the row's loss and every element of
//   its gradient NaN (the kernel cannot throw; the NaN reaches the loss and
//   the gradient statistics).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/act.h"

namespace mp {

void gpt_classifier_cuda(Act logits, const int32_t* targets, int64_t rows, int64_t vocab, int64_t padded_vocab,
                         int64_t loss_rows, float* row_loss, cudaStream_t stream);

}  // namespace mp

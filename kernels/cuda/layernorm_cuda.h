// kernels/cuda/layernorm_cuda.h: LayerNorm of the GPT's residual stream on
// a CUDA device, the CUDA bodies of kernels/nn/layernorm.h (the CPU's are
// kernels/cpu/layernorm.h, with the same per-element math,
// kernels/gpt_math.h). x, w, b, mean, rstd and the input gradient are
// fp32; the output and its gradient are activations (kernels/act.h).
//
// Note [LayerNorm kernels]
// - Forward: one warp per row, 16-byte loads and stores where the row
//   allows (channels a multiple of 8, 16-byte aligned pointers), the row's
//   mean and variance as warp sums (fixed trees).
// - Backward, two kernels (launch configurations: kernels/cuda_launch.h).
//   A block takes a run of rows (at least 32; enough that at most 1024
//   blocks cover the rows). Each warp first finds its rows' two sums (the
//   means of w g and of w g norm); then, one column tile of 256 channels at
//   a time, each warp writes its rows' dx (accumulated into the residual
//   gradient, or overwriting it, and its bf16 copy in the same pass) and
//   adds their dw, db terms in row order, and the block adds its warps'
//   terms in warp order into its partial row in the workspace. Its shared
//   memory is 16 KiB at any width. The second kernel adds the blocks'
//   partial rows in block order, a column per thread over eight slices of
//   the blocks. No floating-point atomics: the same inputs give the same
//   bits, and those depend only on the shape.
// - Asynchronous on `stream`; shapes and pointers are checked on the host
//   (EnforceError).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/act.h"

namespace mp {

void gpt_layernorm_forward_cuda(const float* x, const float* w, const float* b, int64_t rows, int64_t channels,
                                Act out, float* mean, float* rstd, cudaStream_t stream);

int64_t gpt_layernorm_backward_cuda_workspace_bytes(int64_t rows, int64_t channels);

// dx := dx + d loss / d x (accumulate) or d loss / d x; dx_copy (data may
// be null) := dx as dx_copy stores it; dw, db overwritten.
void gpt_layernorm_backward_cuda(Act dout, const float* x, const float* w, const float* mean, const float* rstd,
                                 int64_t rows, int64_t channels, float* dx, bool accumulate, Act dx_copy, float* dw,
                                 float* db, void* workspace, cudaStream_t stream);

}  // namespace mp

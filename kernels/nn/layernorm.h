// kernels/nn/layernorm.h: LayerNorm (eps 1e-5, biased variance) as ops on
// a stream (Note [Op dispatch] in kernels/dispatch.h); CPU bodies
// kernels/cpu/layernorm.h, CUDA bodies kernels/cuda/layernorm_cuda.h.
// Rows of `channels` values of the residual stream (fp32); mean and rstd
// ([rows], fp32) are saved for the backward. The output, read only by the
// next GEMM, is stored as that GEMM reads it (kernels/act.h), and so is its
// gradient.
#pragma once

#include <cstdint>

#include "kernels/act.h"
#include "kernels/dispatch.h"

namespace mp::nn {

// Scratch of both ops on `device`, in bytes (the CPU widens bf16 values
// into it; a GPU's backward keeps its partial column sums there).
int64_t layernorm_workspace_bytes(Device device, int64_t rows, int64_t channels);

// out = (x - mean) * rstd * w + b per row.
void layernorm_forward(const OpContext& cx, const float* x, const float* w, const float* b, int64_t rows,
                       int64_t channels, Act out, float* mean, float* rstd, void* workspace);

// From dout, the output's gradient: dx (fp32) := dx + d loss / d x
// (accumulate: the residual stream's gradient) or d loss / d x; with
// dx_copy.data, dx_copy := that dx as dx_copy stores it (the next bf16
// GEMM's input, in the same pass). dw and db overwritten.
void layernorm_backward(const OpContext& cx, Act dout, const float* x, const float* w, const float* mean,
                        const float* rstd, int64_t rows, int64_t channels, float* dx, bool accumulate, Act dx_copy,
                        float* dw, float* db, void* workspace);

}  // namespace mp::nn

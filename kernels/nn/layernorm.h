// kernels/nn/layernorm.h: LayerNorm (eps 1e-5, biased variance) as ops on
// a stream (Note [Op dispatch] in kernels/dispatch.h); CPU bodies
// kernels/cpu/gpt_ops.h, CUDA bodies kernels/cuda/gpt_ops_cuda.h. Rows of
// `channels` values; mean and rstd ([rows]) are saved for the backward.
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"

namespace mp::nn {

// out = (x - mean) * rstd * w + b per row.
void layernorm_forward(const OpContext& cx, const float* x, const float* w, const float* b, int64_t rows,
                       int64_t channels, float* out, float* mean, float* rstd);

// sum := a + b (sum may alias a or b), then the layernorm of sum: the
// residual add before a block's second LayerNorm. One pass on a GPU, two on
// the CPU; the same bits as the add then layernorm_forward either way.
void residual_layernorm_forward(const OpContext& cx, const float* a, const float* b, const float* w,
                                const float* bias, int64_t rows, int64_t channels, float* sum, float* out,
                                float* mean, float* rstd);

// Scratch of layernorm_backward on `device` (0 on the CPU).
int64_t layernorm_backward_workspace_bytes(Device device, int64_t rows, int64_t channels);

// Accumulates the input gradient into dx (dx += d loss / d x); overwrites
// dw and db.
void layernorm_backward(const OpContext& cx, const float* dout, const float* x, const float* w, const float* mean,
                        const float* rstd, int64_t rows, int64_t channels, float* dx, float* dw, float* db,
                        void* workspace);

}  // namespace mp::nn

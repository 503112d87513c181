// kernels/nn/gelu.h: GPT-2's GELU (the tanh approximation, math::gelu in
// kernels/gpt_math.h) as ops on a stream (Note [Op dispatch] in
// kernels/dispatch.h). Where it follows a GEMM, linear_forward and
// linear_backward (kernels/nn/gemm.h) take it along instead.
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"

namespace mp::nn {

// out[i] = gelu(x[i]).
void gelu_forward(const OpContext& cx, const float* x, int64_t n, float* out);
// dx[i] = dout[i] * gelu'(x[i]); dx may alias dout.
void gelu_backward(const OpContext& cx, const float* x, const float* dout, int64_t n, float* dx);

}  // namespace mp::nn

// kernels/cpu/elementwise.h: the element-wise layer ops: GELU, the residual add and the activations' casts on the CPU
// (Note [Layer ops on the CPU] in kernels/cpu/layer_parts.h): templates over T, and the cast between activations that
// may hold bf16 (kernels/act.h).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/act.h"

namespace mp {

// ---- gelu -----------------------------------------------------------------------
// The tanh approximation of GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class T>
void gpt_gelu_forward(const T* x, int64_t n, T* out, int threads);

// dx = dout * gelu'(x); dx may alias dout.
template <class T>
void gpt_gelu_backward(const T* x, const T* dout, int64_t n, T* dx, int threads);

// ---- residual -------------------------------------------------------------------
// out = a + b elementwise; out may alias a or b.
template <class T>
void gpt_add(const T* a, const T* b, int64_t n, T* out, int threads);

// ---- casts ------------------------------------------------------------------------
// dst := src (n values): widened exactly, rounded to bf16 where dst holds
// bf16 values, or copied.
void gpt_convert(Act src, Act dst, int64_t n, int threads);

}  // namespace mp

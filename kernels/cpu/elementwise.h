// kernels/cpu/elementwise.h: the cast between activations that may hold bf16 (kernels/act.h) on the CPU (Note [Layer
// ops on the CPU] in kernels/cpu/layer_parts.h; the tests' GELU and residual add are tests/gpt_test_ops.h).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/act.h"

namespace mp {

// ---- casts ------------------------------------------------------------------------
// dst := src (n values): widened exactly, rounded to bf16 where dst holds
// bf16 values, or copied.
void gpt_convert(Act src, Act dst, int64_t n, int threads);

}  // namespace mp

// kernels/cpu/layernorm.h: LayerNorm on the CPU (Note [Layer ops on the CPU] in
// kernels/cpu/layer_parts.h) on activations that may hold bf16 (kernels/act.h); the template over T the tests
// call is in tests/gpt_test_ops.h.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/act.h"
#include "kernels/gpt_math.h"

namespace mp {

inline constexpr double kGptLayerNormEps = math::kGptLayerNormEps;

// ---- layernorm -------------------------------------------------------------------
int64_t gpt_layernorm_act_scratch_elements(int64_t rows, int64_t channels);

// out := the LayerNorm of x [rows, channels] (fp32) with w, b; mean, rstd [rows].
void gpt_layernorm_forward(const float* x, const float* w, const float* b, int64_t rows, int64_t channels, Act out,
                           float* mean, float* rstd, float* scratch, int threads);

// From dout (the output's gradient, stored as the output was): dx (fp32
// [rows, channels]) := dx + d loss / d x (accumulate) or d loss / d x;
// with dx_copy.data, dx_copy := that dx as dx_copy stores it (rounded to
// bf16: the next bf16 GEMM's input). dw, db overwritten.
void gpt_layernorm_backward(Act dout, const float* x, const float* w, const float* mean, const float* rstd,
                            int64_t rows, int64_t channels, float* dx, bool accumulate, Act dx_copy, float* dw,
                            float* db, float* scratch, int threads);

}  // namespace mp

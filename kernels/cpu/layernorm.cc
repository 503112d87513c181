// kernels/cpu/layernorm.cc: kernels/cpu/layernorm.h.
#include "kernels/cpu/layernorm.h"

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/layer_loops.h"
#include "kernels/cpu/layer_parts.h"
#include "kernels/op_profile.h"

namespace mp {

using layer::bind_act;
using layer::check_act;
using layer::part_align;

// ---- layernorm -------------------------------------------------------------------

int64_t gpt_layernorm_act_scratch_elements(int64_t rows, int64_t channels) {
  (void)rows;
  (void)channels;
  return 0;  // the loops read and write bf16 values themselves
}

void gpt_layernorm_forward(const float* x, const float* w, const float* b, int64_t rows, int64_t channels, Act out,
                           float* mean, float* rstd, float* scratch, int threads) {
  ScopedOp op(OpFamily::kLayerNorm);
  (void)scratch;
  check_act(out, "layernorm output");
  LayerNormLoopArgs<float> a{x, w, b, channels, nullptr, mean, rstd};
  bind_act(out, a.out, a.out16, &a.round);
  parallel_for(rows, threads, part_align(3 * channels),
               [&](int64_t n0, int64_t n1) { layer_loops().layernorm_forward(a, n0, n1); });
}

void gpt_layernorm_backward(Act dout, const float* x, const float* w, const float* mean, const float* rstd,
                            int64_t rows, int64_t channels, float* dx, bool accumulate, Act dx_copy, float* dw,
                            float* db, float* scratch, int threads) {
  ScopedOp op(OpFamily::kLayerNorm);
  (void)scratch;
  check_act(dout, "layernorm output gradient");
  LayerNormGradLoopArgs<float> a{nullptr, x, w, mean, rstd, rows, channels, dx, dw, db};
  bind_act(dout, a.dout, a.dout16);
  a.accumulate = accumulate;
  if (dx_copy.data != nullptr) {
    check_act(dx_copy, "layernorm input gradient copy");
    if (dx_copy.dtype == DType::kBF16) {
      a.dx_copy16 = static_cast<bf16*>(dx_copy.data);
    } else {
      MP_ENFORCE(dx_copy.bf16, "layernorm input gradient copy of fp32 values: use dx itself");
      a.dx_copy = dx_copy.f32();
    }
  }
  parallel_for(rows, threads, part_align(4 * channels),
               [&](int64_t n0, int64_t n1) { layer_loops().layernorm_grad_input(a, n0, n1); });
  parallel_for(channels, threads, part_align(2 * rows, 8),
               [&](int64_t c0, int64_t c1) { layer_loops().layernorm_grad_params(a, c0, c1); });
}

}  // namespace mp

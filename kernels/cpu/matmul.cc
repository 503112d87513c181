// kernels/cpu/matmul.cc: kernels/cpu/matmul.h.
#include "kernels/cpu/matmul.h"

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/layer_loops.h"
#include "kernels/cpu/layer_parts.h"
#include "kernels/op_profile.h"

namespace mp {

using layer::part_align;

GptGemmInput gpt_round_to_bf16(const float* x, int64_t n, DType storage, void* out, int threads) {
  ScopedOp op(OpFamily::kCast);
  MP_ENFORCE(storage == DType::kBF16 || storage == DType::kF32, "bf16 values stored as ", dtype_name(storage));
  const LayerLoops& l = layer_loops();
  parallel_for(n, threads, part_align(1, 16), [&](int64_t j0, int64_t j1) {
    if (storage == DType::kBF16) {
      l.round_to_bf16(x, static_cast<bf16*>(out), j0, j1);
    } else {
      l.round_through_bf16(x, static_cast<float*>(out), j0, j1);
    }
  });
  return GptGemmInput{out, storage};
}

}  // namespace mp

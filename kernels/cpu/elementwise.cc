// kernels/cpu/elementwise.cc: kernels/cpu/elementwise.h.
#include "kernels/cpu/elementwise.h"

#include <cstring>

#include "core/parallel.h"
#include "kernels/cpu/layer_parts.h"
#include "kernels/op_profile.h"

namespace mp {

using layer::check_act;
using layer::kChunk;
using layer::store;
using layer::widen;

// ---- casts ------------------------------------------------------------------------

void gpt_convert(Act src, Act dst, int64_t n, int threads) {
  ScopedOp op(OpFamily::kCast);
  check_act(src, "conversion source");
  check_act(dst, "conversion destination");
  if (src.dtype == DType::kF32) {
    store(src.f32(), dst, n, threads);
    return;
  }
  if (dst.dtype == DType::kBF16) {
    parallel_for(n, threads, kChunk, [&](int64_t j0, int64_t j1) {
      std::memcpy(static_cast<bf16*>(dst.data) + j0, static_cast<const bf16*>(src.data) + j0,
                  static_cast<size_t>(j1 - j0) * sizeof(bf16));
    });
    return;
  }
  widen(src, dst.f32(), n, threads);
}

}  // namespace mp

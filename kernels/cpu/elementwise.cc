// kernels/cpu/elementwise.cc: kernels/cpu/elementwise.h.
#include "kernels/cpu/elementwise.h"

#include <cstring>

#include "core/parallel.h"
#include "kernels/cpu/layer_parts.h"
#include "kernels/gpt_math.h"
#include "kernels/op_profile.h"

namespace mp {

using layer::check_act;
using layer::kChunk;
using layer::loops;
using layer::part_align;
using layer::store;
using layer::widen;

// ---- gelu -----------------------------------------------------------------------
// The per-element math lives in kernels/gpt_math.h, shared with the CUDA kernels.

template <class T>
void gpt_gelu_forward(const T* x, int64_t n, T* out, int threads) {
  ScopedOp op(OpFamily::kGelu);
  parallel_for(n, threads, part_align(32, 16),
               [&](int64_t j0, int64_t j1) { loops<T>().gelu_forward(x, out, j0, j1); });
}

template <class T>
void gpt_gelu_backward(const T* x, const T* dout, int64_t n, T* dx, int threads) {
  ScopedOp op(OpFamily::kGelu);
  parallel_for(n, threads, part_align(32, 16),
               [&](int64_t j0, int64_t j1) { loops<T>().gelu_backward(x, dout, dx, j0, j1); });
}

// ---- residual -------------------------------------------------------------------

template <class T>
void gpt_add(const T* a, const T* b, int64_t n, T* out, int threads) {
  ScopedOp op(OpFamily::kElementwise);
  parallel_for(n, threads, part_align(1, 16), [&](int64_t j0, int64_t j1) { loops<T>().add(a, b, out, j0, j1); });
}

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

#define MP_INSTANTIATE(T)                                                   \
  template void gpt_gelu_forward<T>(const T*, int64_t, T*, int);            \
  template void gpt_gelu_backward<T>(const T*, const T*, int64_t, T*, int); \
  template void gpt_add<T>(const T*, const T*, int64_t, T*, int);

MP_INSTANTIATE(float)
MP_INSTANTIATE(double)
#undef MP_INSTANTIATE

}  // namespace mp

// kernels/cpu/layer_parts.cc: kernels/cpu/layer_parts.h.
#include "kernels/cpu/layer_parts.h"

#include <cstring>

#include "core/parallel.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/layer_loops_impl.h"

namespace mp::layer {

const LayerLoopsOf<double>& double_loops() {
  static constexpr LayerLoopsOf<double> kLoops = make_layer_loops<double>();
  return kLoops;
}

void check_act(const Act& a, const char* what) {
  MP_ENFORCE(a.data != nullptr, what, " is null");
  MP_ENFORCE(a.dtype == DType::kF32 || (a.dtype == DType::kBF16 && a.bf16), what, " stored as ", dtype_name(a.dtype),
             a.bf16 ? " holding bf16 values" : "", ": need fp32 or bf16");
}

// dst[i] := src's values widened exactly, i in [0, n).
void widen(const Act& src, float* dst, int64_t n, int threads) {
  parallel_for(n, threads, kChunk, [&](int64_t j0, int64_t j1) {
    if (src.dtype == DType::kBF16) {
      const bf16* s = static_cast<const bf16*>(src.data);
      for (int64_t j = j0; j < j1; ++j) dst[j] = math::to_f32(s[j]);
    } else {
      std::memcpy(dst + j0, src.f32() + j0, static_cast<size_t>(j1 - j0) * sizeof(float));
    }
  });
}

// dst := src (fp32 values) as dst stores them.
void store(const float* src, const Act& dst, int64_t n, int threads) {
  const LayerLoops& l = layer_loops();
  parallel_for(n, threads, kChunk, [&](int64_t j0, int64_t j1) {
    if (dst.dtype == DType::kBF16) {
      l.round_to_bf16(src, static_cast<bf16*>(dst.data), j0, j1);
    } else if (dst.bf16) {
      l.round_through_bf16(src, dst.f32(), j0, j1);
    } else {
      std::memcpy(dst.f32() + j0, src + j0, static_cast<size_t>(j1 - j0) * sizeof(float));
    }
  });
}

}  // namespace mp::layer

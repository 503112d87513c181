// kernels/accumulate_math.h: the per-element math of gradient accumulation
// (kernels/cpu/accumulate.h) and of the engine's NaN fault (kernels/ops.h),
// shared by the CPU loops and the CUDA kernels (kernels/cuda/ops.cu) so both
// give the same bits.
#pragma once

#include <cstdint>

#include "kernels/convert_math.h"
#include "kernels/hd.h"

namespace mp::math {

// round(dst + src), the sum in fp32, or round(src) with overwrite: one
// rounding into D (nearest-even).
template <class D, class S>
MP_HD D accumulate_into(D dst, S src, bool overwrite) {
  const float s = to_f32(src);
  return from_f32<D>(overwrite ? s : to_f32(dst) + s);
}

// One step of the deterministic fp64 accumulation: acc + x in fp64 (exact
// for the fp32 sums of a few blocks), blocks added in block order.
MP_HD double add_f64(double acc, float x) { return acc + static_cast<double>(x); }

// The quiet NaN MP_FAULT's nan fault writes, as bits of each dtype.
inline constexpr uint32_t kQuietNanF32Bits = 0x7fc00000u;
inline constexpr uint16_t kQuietNanBf16Bits = 0x7fc0;
inline constexpr uint16_t kQuietNanF16Bits = 0x7e00;

}  // namespace mp::math

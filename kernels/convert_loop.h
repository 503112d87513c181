// kernels/convert_loop.h: the per-element body of convert(), one definition
// for the CPU loop (kernels/cpu/convert.cc) and the CUDA kernel
// (kernels/cuda/convert.cu).
#pragma once

#include <cstdint>

#include "kernels/convert_math.h"
#include "kernels/philox_math.h"

namespace mp::math {

template <class Src, class Dst, bool kStochastic>
MP_HD void convert_element(const Src* src, Dst* dst, int64_t i, uint64_t seed, uint64_t step,
                           uint64_t index_offset) {
  const float x = to_f32(src[i]);
  if constexpr (kStochastic) {
    dst[i] = from_f32_stochastic<Dst>(x, philox_u32(seed, step, index_offset + static_cast<uint64_t>(i)));
  } else {
    dst[i] = from_f32<Dst>(x);
  }
}

}  // namespace mp::math

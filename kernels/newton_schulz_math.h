// kernels/newton_schulz_math.h: the element passes of Note [Newton-Schulz
// iteration] (kernels/cpu/newton_schulz.h), written once for the CPU loops
// and the CUDA kernels. T is the iteration dtype's storage (float or bf16);
// every line rounds once into it, after fp32 arithmetic. The CUDA file that
// compiles them does so with --fmad=false, so nothing is contracted into an
// FMA on either side and the element passes give the same bits.
#pragma once

#include <cmath>

#include "kernels/convert_math.h"
#include "kernels/hd.h"

namespace mp {

// What X is divided by: max(round_s(||X||_F), round_s(eps)), ||X||_F from
// the fp64 sum of squares; NaN when X holds a NaN or Inf.
template <class T>
MP_HD float ns_divisor(double sum_sq, bool non_finite, double eps) {
  if (non_finite) return math::f32_from_bits(0x7fc00000u);
  const float norm = math::to_f32(math::from_f32<T>(static_cast<float>(sqrt(sum_sq))));
  const float floor = math::to_f32(math::from_f32<T>(static_cast<float>(eps)));
  return norm < floor ? floor : norm;
}

// X = round_s(X / d).
template <class T>
MP_HD T ns_scaled(T x, float d) {
  return math::from_f32<T>(math::to_f32(x) / d);
}

// B = round_s(b A + c P), P = A A in fp32.
template <class T>
MP_HD T ns_combine_b(T a, float p, float cb, float cc) {
  return math::from_f32<T>(cb * math::to_f32(a) + cc * p);
}

// X = round_s(a X + P), P = B X in fp32.
template <class T>
MP_HD T ns_combine_x(T x, float p, float ca) {
  return math::from_f32<T>(ca * math::to_f32(x) + p);
}

}  // namespace mp

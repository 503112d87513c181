// kernels/convert_loop.h: the per-element body of convert(), one definition
// for the CPU loop (kernels/cpu/convert.cc) and the CUDA kernel
// (kernels/cuda/convert.cu).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/convert_math.h"
#include "kernels/philox_math.h"
#include "kernels/reduce_math.h"

namespace mp::math {

// The per-launch constants of a conversion.
struct ConvertParams {
  uint64_t seed = 0;
  uint64_t step = 0;
  uint64_t index_offset = 0;
  double divisor = 1.0;
  // 1 / divisor when the divisor is a power of two (the product is then
  // exact in fp32 unless it is subnormal), else 0.
  float exact_inverse = 1.0f;
};

MP_HD ConvertParams make_convert_params(uint64_t seed, uint64_t step, uint64_t index_offset,
                                        double divisor) {
  ConvertParams p{seed, step, index_offset, divisor, 0.0f};
  int e = 0;
  const double m = divisor > 0 ? frexp(divisor, &e) : 0.0;
  if (m == 0.5 && e > -120 && e < 120) p.exact_inverse = static_cast<float>(1.0 / divisor);
  return p;
}

// With a divisor other than 1 the quotient is rounded once: an exact fp32
// product for power-of-two divisors (outside fp32's subnormal range), an
// fp64 quotient otherwise. Stochastic rounding takes the quotient in fp32.
template <class Src, class Dst, bool kStochastic>
MP_HD void convert_element(const Src* src, Dst* dst, int64_t i, const ConvertParams& p) {
  if (p.divisor != 1.0 && !kStochastic) {
    const float x = to_f32(src[i]);
    const float q = x * p.exact_inverse;
    // The product is exact unless it underflowed or is subnormal.
    const bool inexact = q == 0.0f ? x != 0.0f : (q < 0 ? -q : q) < 1.17549435e-38f;
    if (p.exact_inverse != 0.0f && !inexact) {
      dst[i] = from_f32<Dst>(q);
    } else {
      dst[i] = round_from_f64<Dst>(to_f64(src[i]) / p.divisor);
    }
    return;
  }
  const uint64_t seed = p.seed, step = p.step, index_offset = p.index_offset;
  const float x = p.divisor != 1.0 ? static_cast<float>(to_f64(src[i]) / p.divisor) : to_f32(src[i]);
  if constexpr (kStochastic) {
    dst[i] = from_f32_stochastic<Dst>(x, philox_u32(seed, step, index_offset + static_cast<uint64_t>(i)));
  } else {
    dst[i] = from_f32<Dst>(x);
  }
}

// x rounded to Wire (nearest-even) and widened back exactly: convert_element's
// path without a divisor, as one expression, so loops of it vectorize.
template <class Wire>
MP_HD float round_through_unit(float x) {
  return to_f32(from_f32<Wire>(x));
}

// convert_element into Wire (nearest-even), widened back to fp32 exactly:
// the value a one-rank reduction in the Wire dtype with fp32 accumulation
// leaves (the one-rank path's rounding: ops::grad_stats with RoundThrough).
template <class Wire>
MP_HD float round_through_element(float x, const ConvertParams& p) {
  Wire w;
  convert_element<float, Wire, false>(&x, &w, 0, p);
  return to_f32(w);
}

}  // namespace mp::math

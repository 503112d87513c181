// kernels/reduce_math.h: per-element reduction math shared by the MPI user
// ops, the CPU accumulation loop and the CUDA accumulation kernel.
// Arithmetic is in fp64 and the result is rounded once into the output type.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/convert_math.h"

namespace mp::math {

enum class ElementOp : uint8_t { kSum = 0, kMax = 1, kMin = 2 };

// Max and min propagate NaN (unlike fmax/fmin and NCCL's float max).
MP_HD double apply_op(double a, double b, ElementOp op) {
  switch (op) {
    case ElementOp::kSum: return a + b;
    case ElementOp::kMax: return (a != a || b != b) ? a + b : (a > b ? a : b);
    case ElementOp::kMin: return (a != a || b != b) ? a + b : (a < b ? a : b);
  }
  return a + b;
}

// fp64 -> fp32 rounding to odd: an inexact result gets an odd mantissa. A
// later nearest-even rounding to bf16, fp16 or fp8 (at least 2 bits fewer)
// then equals rounding the fp64 value directly: one rounding, not two.
MP_HD float f64_to_f32_round_odd(double d) {
  const float f = static_cast<float>(d);  // nearest-even
  if (static_cast<double>(f) == d || d != d) return f;
  uint32_t u = f32_bits(f);
  if ((u & 1u) == 0) {
    const double af = f < 0 ? -static_cast<double>(f) : static_cast<double>(f);
    const double ad = d < 0 ? -d : d;
    u = af > ad ? u - 1 : u + 1;  // one ulp towards d, in magnitude (sign bit untouched)
  }
  return f32_from_bits(u);
}

// Rounds an fp64 value once, to nearest-even, into storage type T.
template <class T>
MP_HD T round_from_f64(double d) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(d);
  } else {
    return from_f32<T>(f64_to_f32_round_odd(d));
  }
}

MP_HD double to_f64(float x) { return static_cast<double>(x); }
template <class T>
MP_HD double to_f64(T x) {
  return static_cast<double>(to_f32(x));
}

// inout = inout (op) in, rounded once: the wire-dtype reduction step.
// Computed in fp32, which is exact enough: a sum of two bf16 (fp16) values
// is exact in fp32 unless their exponents differ by more than 16 (13); then
// the smaller term is under 2^-16 (2^-13) of the larger, far from the
// nearest tie of the narrow type (2^-8 and 2^-11 relative), so rounding the
// fp32 sum equals rounding the exact sum. Max and min are exact.
template <class T>
MP_HD void reduce_pair_element(const T* in, T* inout, int64_t i, ElementOp op) {
  const float a = to_f32(inout[i]), b = to_f32(in[i]);
  float r;
  switch (op) {
    case ElementOp::kMax: r = (a != a || b != b) ? a + b : (a > b ? a : b); break;
    case ElementOp::kMin: r = (a != a || b != b) ? a + b : (a < b ? a : b); break;
    default: r = a + b;
  }
  inout[i] = from_f32<T>(r);
}

// out[i] = (chunk_0[i] (op) chunk_1[i] (op) ... chunk_{n-1}[i]) / divisor,
// accumulated in fp64 in rank order and rounded once; chunk k starts at
// chunks + k * stride.
template <class In, class Out>
MP_HD void accumulate_element(const In* chunks, int n, int64_t stride, int64_t i, Out* out,
                              ElementOp op, double divisor) {
  double acc = to_f64(chunks[i]);
  for (int k = 1; k < n; ++k) acc = apply_op(acc, to_f64(chunks[k * stride + i]), op);
  out[i] = round_from_f64<Out>(acc / divisor);
}

}  // namespace mp::math

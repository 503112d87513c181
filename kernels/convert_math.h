// kernels/convert_math.h: per-element conversions between fp32 and the 16-
// and 8-bit float formats, written once with integer arithmetic so that CPU
// and GPU produce identical bits (no FTZ, no intrinsics, no host rounding mode).
//
// Narrowing (fp32 -> bf16, fp16, fp8):
// - round to nearest, ties to even; denormals of the target are produced
//   exactly and fp32 denormal inputs are rounded, not flushed;
// - bf16, fp16, e5m2: overflow rounds to +-Inf (IEEE: values from
//   max + ulp/2 up); e4m3 (no Inf) saturates to +-448, Inf included;
// - NaN stays NaN with its sign and the top bits of its payload; when those
//   bits are all zero the quiet bit is set so the result is not Inf. Every
//   bit pattern of every narrow type therefore survives narrow -> fp32 ->
//   narrow unchanged (e4m3 has a single NaN per sign).
// Stochastic rounding (bf16, fp16): rounds away from zero in magnitude with
// probability (distance to the lower neighbour) / (gap between neighbours),
// decided by a caller-given uniform 32-bit word (kernels/philox_math.h), so
// it is unbiased and reproducible; exactly representable values are
// returned unchanged. The probability is exact to 2^-32; for results below
// 2^-8 of the smallest denormal it is truncated, a bias below 2^-32 ulp.
// Widening (-> fp32) is exact.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/hd.h"

namespace mp::math {

MP_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

MP_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// ---- bf16 -------------------------------------------------------------------

MP_HD uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  // NaN: keep sign and top payload (set the quiet bit if that would be Inf).
  const uint32_t nan = (u >> 16) | (((u >> 16) & 0x7fu) ? 0u : 0x40u);
  // A select, not a branch, so CPU loops vectorize.
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

MP_HD uint16_t f32_to_bf16_bits_stochastic(float f, uint32_t rand) {
  const uint32_t u = f32_bits(f);
  // Adding a uniform 16-bit value carries into bit 16 with probability
  // (low 16 bits) / 2^16; Inf has zero low bits and stays Inf. NaN as RNE.
  const uint16_t up = static_cast<uint16_t>((u + (rand & 0xffffu)) >> 16);
  return (u & 0x7fffffffu) > 0x7f800000u ? f32_to_bf16_bits(f) : up;
}

MP_HD float bf16_bits_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// ---- generic narrow formats (fp16, fp8) -------------------------------------

// A binary float format with kExp exponent bits and kMan mantissa bits.
// kIeee: the all-ones exponent encodes Inf and NaN. Otherwise (the "FN"
// formats such as e4m3) only the all-ones pattern is NaN and overflow
// saturates to the largest finite value.
template <int kExpBits, int kManBits, bool kIeeeInf>
struct Format {
  static constexpr int kExp = kExpBits;
  static constexpr int kMan = kManBits;
  static constexpr bool kIeee = kIeeeInf;
  static constexpr int kBias = (1 << (kExp - 1)) - 1;
  static constexpr uint32_t kSignBit = 1u << (kExp + kMan);
  static constexpr uint32_t kManMask = (1u << kMan) - 1;
  static constexpr uint32_t kExpAllOnes = (1u << kExp) - 1;
  static constexpr uint32_t kInf = kExpAllOnes << kMan;          // IEEE formats only
  static constexpr uint32_t kNaN = kInf | kManMask;              // the FN NaN pattern
  static constexpr uint32_t kMaxFinite = kIeee ? kInf - 1 : kNaN - 1;
};
using Fp16Format = Format<5, 10, true>;
using E5M2Format = Format<5, 2, true>;
using E4M3Format = Format<4, 3, false>;

// Shifts the significand `mant` (< 2^24) right by `shift` >= 1 bits, rounding
// to nearest-even, or up with probability rem / 2^shift when `stochastic`.
MP_HD uint32_t round_right(uint32_t mant, int shift, bool stochastic, uint32_t rand) {
  const uint32_t q = shift < 32 ? mant >> shift : 0u;
  const uint32_t rem = shift < 32 ? mant & ((1u << shift) - 1u) : mant;
  bool up;
  if (stochastic) {
    // rem / 2^shift as a 32-bit fixed-point fraction; exact for shift <= 32.
    const uint32_t frac =
        shift <= 32 ? static_cast<uint32_t>(static_cast<uint64_t>(rem) << (32 - shift))
        : shift < 64 ? rem >> (shift - 32)
                     : 0u;
    up = rand < frac;
  } else {
    // Past a shift of 25 the half-way point exceeds any 24-bit significand.
    const uint32_t half = shift <= 25 ? 1u << (shift - 1) : 0xffffffffu;
    up = rem > half || (rem == half && (q & 1u));
  }
  return q + (up ? 1u : 0u);
}

// Written with selects rather than branches so CPU loops over it vectorize.
template <class F>
MP_HD uint32_t f32_to_narrow_bits(float f, bool stochastic, uint32_t rand) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 31) ? F::kSignBit : 0u;
  const uint32_t a = u & 0x7fffffffu;
  uint32_t nan;
  if constexpr (!F::kIeee) {
    nan = sign | F::kNaN;
  } else {
    const uint32_t payload = (a >> (23 - F::kMan)) & F::kManMask;
    nan = sign | F::kInf | (payload ? payload : 1u << (F::kMan - 1));
  }
  const uint32_t inf = sign | (F::kIeee ? F::kInf : F::kMaxFinite);
  const uint32_t exp32 = a >> 23;
  // fp32 denormals have no implicit bit and the exponent of the smallest normal.
  const uint32_t mant = exp32 ? (a & 0x7fffffu) | 0x800000u : a;
  const int e = (exp32 ? static_cast<int>(exp32) : 1) - 127 + F::kBias;  // target's biased exponent
  // Normal target (e >= 1): q carries the implicit bit 2^kMan, and a carry
  // out of the mantissa bumps the exponent. Otherwise a target denormal (or 0).
  const bool normal = e >= 1;
  const int shift = normal ? 23 - F::kMan : 23 - F::kMan + 1 - e;
  const uint32_t base = normal ? static_cast<uint32_t>(e - 1) << F::kMan : 0u;
  uint32_t r = base + round_right(mant, shift, stochastic, rand);
  r = r > F::kMaxFinite ? (F::kIeee ? F::kInf : F::kMaxFinite) : r;
  return a > 0x7f800000u ? nan : a == 0x7f800000u ? inf : sign | r;
}

template <class F>
MP_HD float narrow_bits_to_f32(uint32_t h) {
  const uint32_t sign = (h & F::kSignBit) ? 0x80000000u : 0u;
  const uint32_t exp = (h >> F::kMan) & F::kExpAllOnes;
  const uint32_t man = h & F::kManMask;
  const uint32_t normal = sign | ((exp - F::kBias + 127) << 23) | (man << (23 - F::kMan));
  // Denormal (and zero): man x 2^(1 - bias - kMan), exact in fp32.
  const float scale = f32_from_bits(static_cast<uint32_t>(127 + 1 - F::kBias - F::kMan) << 23);
  const uint32_t denormal = sign | f32_bits(static_cast<float>(static_cast<int32_t>(man)) * scale);
  uint32_t special;  // what the all-ones exponent (IEEE) or the NaN pattern (FN) means
  bool is_special;
  if constexpr (F::kIeee) {
    special = sign | 0x7f800000u | (man << (23 - F::kMan));
    is_special = exp == F::kExpAllOnes;
  } else {
    special = sign | 0x7fc00000u;
    is_special = (h & ~F::kSignBit) == F::kNaN;
  }
  return f32_from_bits(is_special ? special : exp == 0 ? denormal : normal);
}

MP_HD uint16_t f32_to_fp16_bits(float f) {
  return static_cast<uint16_t>(f32_to_narrow_bits<Fp16Format>(f, false, 0));
}
MP_HD uint16_t f32_to_fp16_bits_stochastic(float f, uint32_t rand) {
  return static_cast<uint16_t>(f32_to_narrow_bits<Fp16Format>(f, true, rand));
}
MP_HD float fp16_bits_to_f32(uint16_t h) { return narrow_bits_to_f32<Fp16Format>(h); }
MP_HD uint8_t f32_to_e4m3_bits(float f) {
  return static_cast<uint8_t>(f32_to_narrow_bits<E4M3Format>(f, false, 0));
}
MP_HD float e4m3_bits_to_f32(uint8_t h) { return narrow_bits_to_f32<E4M3Format>(h); }
MP_HD uint8_t f32_to_e5m2_bits(float f) {
  return static_cast<uint8_t>(f32_to_narrow_bits<E5M2Format>(f, false, 0));
}
MP_HD float e5m2_bits_to_f32(uint8_t h) { return narrow_bits_to_f32<E5M2Format>(h); }

// ---- typed forms, for kernels templated on storage types --------------------

MP_HD float to_f32(float x) { return x; }
MP_HD float to_f32(bf16 x) { return bf16_bits_to_f32(x.bits); }
MP_HD float to_f32(fp16 x) { return fp16_bits_to_f32(x.bits); }
MP_HD float to_f32(fp8_e4m3 x) { return e4m3_bits_to_f32(x.bits); }
MP_HD float to_f32(fp8_e5m2 x) { return e5m2_bits_to_f32(x.bits); }

// Round-to-nearest-even narrowing to storage type T.
template <class T>
MP_HD T from_f32(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return bf16{f32_to_bf16_bits(x)};
  } else if constexpr (std::is_same_v<T, fp16>) {
    return fp16{f32_to_fp16_bits(x)};
  } else if constexpr (std::is_same_v<T, fp8_e4m3>) {
    return fp8_e4m3{f32_to_e4m3_bits(x)};
  } else {
    static_assert(std::is_same_v<T, fp8_e5m2>, "unsupported storage type");
    return fp8_e5m2{f32_to_e5m2_bits(x)};
  }
}

// True when stochastic rounding to T is supported (fp32 is exact: identity).
template <class T>
inline constexpr bool kHasStochasticRounding =
    std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

// Stochastic narrowing to T with a uniform random word `rand`.
template <class T>
MP_HD T from_f32_stochastic(float x, uint32_t rand) {
  static_assert(kHasStochasticRounding<T>, "stochastic rounding is for fp32, bf16 and fp16");
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return bf16{f32_to_bf16_bits_stochastic(x, rand)};
  } else {
    return fp16{f32_to_fp16_bits_stochastic(x, rand)};
  }
}

}  // namespace mp::math

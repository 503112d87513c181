// kernels/remainder_math.h: the bf16_remainder master format. An fp32
// master is stored as its bf16 copy h (what compute and the all-gather use)
// plus an int16 remainder r, 4 bytes in all, and reconstructed exactly.
//
// Note [Why not ties-to-even]
// Round-to-nearest-even maps 65537 fp32 patterns onto every even bf16 value
// (both ties) and 65535 onto every odd one, so no 16-bit remainder can tell
// them apart: an exact split with an RNE copy is impossible. An exact split
// needs 65536 patterns per bf16 value. Among nearest roundings that leaves
// ties away from zero (h = (|u| + 0x8000) >> 16, r = u - (h << 16) in
// [-32768, 32767]), or ties towards zero. The copy here is therefore nearest
// with ties away from zero; it differs from RNE only on exact ties.
//
// What apex (store_param_remainders) and TransformerEngine get wrong, and
// this gets right:
// - NaN: adding 0x8000 to the bits of a NaN with a high payload carries into
//   the sign or the exponent, e.g. 0x7fffffff becomes -0. Here a NaN master
//   gives a NaN copy (sign and top payload kept, the quiet bit set if needed),
//   r holds the low 16 bits, and merge gives back a NaN of the same sign.
// - Inf stays Inf (r = 0). Finite masters from bf16 max + half an ulp up
//   round to an Inf copy, as RNE does, and still merge back exactly.
// - Proven, not assumed: tests split and merge every one of the 2^32 fp32
//   bit patterns.
#pragma once

#include <cstdint>

#include "kernels/convert_math.h"

namespace mp::math {

struct Bf16Remainder {
  uint16_t h;  // the bf16 copy
  int16_t r;   // master bits minus (h << 16), or the low bits of a NaN
};

// Both functions are written with selects, not branches, so CPU loops over
// them vectorize.
MP_HD Bf16Remainder split_bf16_remainder(float master) {
  const uint32_t u = f32_bits(master);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t mag = u & 0x7fffffffu;
  // Nearest, ties away from zero, on the magnitude: at most 0x7f800000 +
  // 0x8000 for non-NaN inputs, so no carry into the sign. For negative
  // numbers the remainder applies to the magnitude too.
  const uint32_t hm = (mag + 0x8000u) >> 16;
  // In uint32 (wrapping), then as int32: for a NaN, hm << 16 can be
  // 0x80000000 and a signed subtraction would overflow (its r is unused).
  const int32_t r = static_cast<int32_t>(mag - (hm << 16));
  const uint16_t h = static_cast<uint16_t>((sign >> 16) | hm);
  // NaN: a NaN copy (f32_to_bf16_bits keeps sign and payload); keep the low bits.
  const bool nan = mag > 0x7f800000u;
  return Bf16Remainder{nan ? f32_to_bf16_bits(master) : h,
                       static_cast<int16_t>(nan ? static_cast<int32_t>(static_cast<int16_t>(u & 0xffffu)) : r)};
}

MP_HD float merge_bf16_remainder(uint16_t h, int16_t r) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t hm = h & 0x7fffu;
  const uint32_t mag = static_cast<uint32_t>(static_cast<int32_t>(hm << 16) + r);
  // NaN copy: high bits from h, low bits from r.
  const uint32_t nan = (static_cast<uint32_t>(h) << 16) | static_cast<uint16_t>(r);
  return f32_from_bits(hm > 0x7f80u ? nan : sign | mag);
}

}  // namespace mp::math

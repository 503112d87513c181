// kernels/quant_math.h: blockwise int8 quantization (DeepSpeed ZeRO++'s qgZ
// format): each block of kQuantBlock fp32 values is stored as int8 codes and
// one fp32 scale, absmax / 127. Per-element math shared by the CPU loops
// (kernels/cpu/quant.h) and a later device kernel.
//
// Note [Int8 blocks]
// scale = max |x| over the block / 127; code = x / scale rounded to nearest
// (ties to even), in [-127, 127]; value = code * scale. So |x - value| <=
// scale / 2 = max|x| / 254 for every finite x, and a block's largest
// magnitude is exact. An all-zero block has scale 0 and codes 0. A block
// holding a NaN or an Inf gets a NaN scale, so every value decoded from it
// is NaN: a non-finite gradient stays visible after the reduction.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/hd.h"

namespace mp::math {

inline constexpr int64_t kQuantBlock = 256;

MP_HD float int8_scale(float absmax) {
  if (!(absmax <= 3.4028235e38f)) return absmax - absmax + NAN;  // NaN or Inf in the block
  return absmax / 127.0f;
}

MP_HD int8_t int8_code(float x, float scale) {
  if (scale == 0.0f || scale != scale) return 0;
  float q = nearbyintf(x / scale);  // the current rounding mode: nearest-even by default
  q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
  return static_cast<int8_t>(q);
}

MP_HD float int8_value(int8_t code, float scale) { return static_cast<float>(code) * scale; }

}  // namespace mp::math

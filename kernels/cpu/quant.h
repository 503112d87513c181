// kernels/cpu/quant.h: blockwise int8 quantization of fp32 data (Note [Int8
// blocks] in kernels/quant_math.h). A quantized span of n elements (n a
// multiple of math::kQuantBlock) is laid out as n int8 codes followed by
// n / kQuantBlock fp32 scales: int8_span_bytes(n) bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/quant_math.h"

namespace mp {

inline constexpr size_t int8_span_bytes(int64_t n) {
  return static_cast<size_t>(n) + static_cast<size_t>(n / math::kQuantBlock) * sizeof(float);
}

// Quantizes x[0, n) into `out` (int8_span_bytes(n) bytes). With `residual`
// (error feedback), residual[i] = x[i] - the value decoded for it.
void quantize_int8(const float* x, int64_t n, void* out, float* residual = nullptr);

// out[i] = decoded value of element i (accumulate: out[i] += it instead).
void dequantize_int8(const void* in, int64_t n, float* out, bool accumulate);

}  // namespace mp

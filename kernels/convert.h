// kernels/convert.h: element-wise conversion between any two dtypes, with
// round-to-nearest-even or reproducible stochastic rounding. The math is
// kernels/convert_math.h; the CPU loop and the CUDA kernel both call it, so
// the two give identical bits.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mp {

enum class Rounding : uint8_t { kNearestEven = 0, kStochastic = 1 };

struct ConvertOptions {
  Rounding rounding = Rounding::kNearestEven;
  // dst[i] = round(src[i] / divisor), divided in fp64 and rounded once.
  double divisor = 1.0;
  // Stochastic rounding draws element i's random word from
  // philox_u32(seed, step, index_offset + i): give a shard its global offset
  // and the result does not depend on how the data was sharded.
  uint64_t seed = 0;
  uint64_t step = 0;
  uint64_t index_offset = 0;
};

// dst[i] = round(src[i] / divisor) for every element. src and dst: same
// device, same element count, any dtypes; dst may alias src exactly (in
// place). Stochastic rounding needs a bf16, fp16 or fp32 destination.
// CPU tensors: converted on the calling thread, or, given a CPU stream,
// submitted to it (in order with its other work). CUDA tensors: on `stream`,
// which must then be a CUDA stream on their device.
void convert(const Tensor& src, const Tensor& dst, const ConvertOptions& options = {},
             Stream* stream = nullptr);

}  // namespace mp

// kernels/cpu/accumulate.h: gradient accumulation over micro-batches, on
// the CPU (the sharded engine's accumulators).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mp {

// dst[i] = round(dst[i] + src[i]) (or round(src[i]) with overwrite), the
// sum in fp32, rounded to nearest-even into dst's dtype. fp32, bf16, fp16.
void accumulate_cpu(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n, bool overwrite);

// acc[i] += src_k[i] for k = 0 .. blocks-1 in that order, src_k at
// src + k * stride, exactly in fp64 per addition (fp32 sources).
void accumulate_f64_cpu(double* acc, const float* src, int blocks, int64_t stride, int64_t n);

// out[i] = (float)acc[i], rounded to nearest-even.
void round_f64_cpu(const double* acc, float* out, int64_t n);

}  // namespace mp

// kernels/cuda/cast_cuda.h: the casts of a model on a CUDA device, the CUDA
// bodies of kernels/nn/cast.h: between activations (kernels/act.h), fp32
// rounded to bf16 for a GEMM, and ranges of narrow parameters widened to
// fp32 in one launch. 16-byte accesses where the pointers allow; the
// element math is kernels/convert_math.h's, so the bits are the CPU's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/act.h"

namespace mp {

// dst := src, n values: widened, rounded to bf16 where dst holds bf16
// values, or copied.
void gpt_convert_cuda(Act src, Act dst, int64_t n, cudaStream_t stream);

// out[i] := x[i] rounded to bf16 (nearest even), stored as bf16 (storage
// kBF16) or as the fp32 of the bf16 value (kF32).
void gpt_round_to_bf16_cuda(const float* x, int64_t n, DType storage, void* out, cudaStream_t stream);

// At most this many ranges per widen_ranges_cuda call.
inline constexpr int kMaxWidenRanges = 16;

// dst[i] := src[i] widened exactly (src fp32, bf16 or fp16) for i in each
// range [begins[r], ends[r]), r < count: one launch.
void widen_ranges_cuda(const void* src, DType src_dtype, float* dst, const int64_t* begins, const int64_t* ends,
                       int count, cudaStream_t stream);

}  // namespace mp

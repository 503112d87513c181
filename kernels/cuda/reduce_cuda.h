// kernels/cuda/reduce_cuda.h: launcher of the CUDA rank-chunk accumulation
// kernel, the device twin of accumulate_rank_chunks_cpu (kernels/cpu/reduce.h).
// Both call math::accumulate_element, so they give identical bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/reduce_math.h"

namespace mp {

// On `stream`, for i < count:
//   out[i] = (chunk_0[i] (op) ... (op) chunk_{n-1}[i]) / divisor,
// chunk k at chunks + k * stride elements (dtype in), accumulated in fp64 in
// chunk order and rounded once into out (dtype out_dtype, which may be
// wider). Device pointers; fp8 is not supported (EnforceError). Asynchronous:
// a launch failure throws CudaError, a fault surfaces from later CUDA calls.
void accumulate_rank_chunks_cuda(const void* chunks, DType in, int n, int64_t stride, int64_t count,
                                 void* out, DType out_dtype, math::ElementOp op, double divisor,
                                 cudaStream_t stream);

}  // namespace mp

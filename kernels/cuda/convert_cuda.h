// kernels/cuda/convert_cuda.h: launcher of the CUDA conversion kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/convert.h"

namespace mp {

// dst[i] = round(src[i]) for i < n on `stream`; device pointers.
void convert_cuda(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                  const ConvertOptions& options, cudaStream_t stream);

}  // namespace mp

// kernels/cuda/ops_cuda.h: the CUDA bodies of kernels/ops.h that are
// kernels of their own (zero, copies and the update are CUDA calls and
// kernels declared elsewhere). Each is the device twin of the CPU loop named,
// calling the same element math, so the two give the same bits. Device
// pointers; asynchronous on `stream`; a launch failure throws CudaError.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace mp {

// The first n elements of `data` (fp32, bf16, fp16) set to a quiet NaN.
void fill_nan_cuda(void* data, DType dtype, int64_t n, cudaStream_t stream);

// ops::device_fault's kernel: one thread writes to an address no allocation
// holds.
void device_fault_cuda(cudaStream_t stream);

// accumulate_cpu (kernels/cpu/accumulate.h): dst = round(dst + src) in fp32,
// or round(src) with overwrite.
void accumulate_cuda(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n, bool overwrite,
                     cudaStream_t stream);

// accumulate_f64_cpu then nothing else: with `first` acc starts from 0;
// acc[i] += src[k * n + i] for k = 0 .. blocks-1 in order, in fp64.
void accumulate_f64_cuda(double* acc, const float* src, int blocks, int64_t n, bool first, cudaStream_t stream);

// round_f64_cpu: out[i] = (float)acc[i], nearest-even.
void round_f64_cuda(const double* acc, float* out, int64_t n, cudaStream_t stream);

// dst[i] = src[i] / divisor rounded into `through`, widened (dst may alias src):
// the rounding of grad_stats_round_cpu (kernels/cpu/grad_stats.h).
void round_through_cuda(const float* src, float* dst, DType through, double divisor, int64_t n,
                        cudaStream_t stream);

}  // namespace mp

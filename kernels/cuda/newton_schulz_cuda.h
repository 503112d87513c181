// kernels/cuda/newton_schulz_cuda.h: the device twin of newton_schulz_cpu
// (kernels/cpu/newton_schulz.h): Note [Newton-Schulz iteration] with its
// three products through cuBLASLt (gemm_cuda, the same GemmProblems as the
// CPU's, newton_schulz_problems.h) and its element passes as kernels of the
// same fp32 arithmetic, each operation rounded on its own (no FMA
// contraction). The bits differ from the CPU's where the products'
// accumulation order does, and where the norm's fp64 sum of squares (summed
// in another order) lands on the other side of a rounding boundary.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/newton_schulz.h"

namespace mp {

// The device scratch newton_schulz_cuda needs for a [rows, cols] matrix: X
// [m, n], A and B [m, m] in the iteration dtype, the fp32 product [m, n],
// and the norm's statistics and partials.
int64_t newton_schulz_cuda_scratch_bytes(int64_t rows, int64_t cols, const NewtonSchulzOptions& options);

// out = NS(g) on `stream`, asynchronous (but for a new GEMM plan's timing,
// Note [cuBLASLt GEMM]); g, out (row-major [rows, cols] fp32, which may be
// the same array) and scratch are device memory of the calling thread's
// current device. options.threads is not read. Throws EnforceError for a
// bad shape, option or a scratch too short, CudaError when a launch or a
// product fails.
void newton_schulz_cuda(const float* g, float* out, int64_t rows, int64_t cols, const NewtonSchulzOptions& options,
                        void* scratch, int64_t scratch_bytes, cudaStream_t stream);

}  // namespace mp

// kernels/cuda/grad_stats_cuda.h: the device twin of grad_stats_cpu
// (kernels/cpu/grad_stats.h): one read of a gradient shard giving the sum of
// squares (fp64) of grad x multiplier and whether any element is NaN or
// Inf, left in device memory for the all-reduce and the step decision (no
// host sync).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace mp {

// Device-resident result.
struct DeviceGradStats {
  double sum_sq;
  int32_t non_finite;  // 0 or 1
  int32_t pad_;
};

// Scratch the two-pass reduction needs (per-block partials).
int64_t grad_stats_cuda_workspace_bytes();

// Asynchronous on `stream`. Deterministic: per-block partials are summed in
// a fixed order by a second kernel, so the same input gives the same bits
// (no atomics). `grad`, `out` and `workspace` are device memory; fp8 is
// refused (EnforceError).
void grad_stats_cuda(const void* grad, DType dtype, int64_t n, float multiplier, DeviceGradStats* out,
                     void* workspace, cudaStream_t stream);

}  // namespace mp

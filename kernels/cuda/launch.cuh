// kernels/cuda/launch.cuh: the one way a kernel of mp is launched, with a
// configuration from kernels/cuda_launch.h (Note [CUDA launch
// configurations]). CUDA sources only.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "core/error_cuda.h"
#include "kernels/cuda_launch.h"

namespace mp {

inline dim3 to_dim3(const LaunchDims& d) {
  return dim3(static_cast<unsigned>(d.x), static_cast<unsigned>(d.y), static_cast<unsigned>(d.z));
}

// kernel<<<c.grid, c.block, c.dynamic_smem_bytes, stream>>>(args...), the
// dynamic shared memory limit raised first where the configuration needs
// it, and the launch checked (CudaError naming the error).
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), const LaunchConfig& c, cudaStream_t stream, Args&&... args) {
  if (needs_smem_optin(c)) {
    MP_CHECK_CUDA(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(c.dynamic_smem_bytes)));
  }
  kernel<<<to_dim3(c.grid), to_dim3(c.block), static_cast<size_t>(c.dynamic_smem_bytes), stream>>>(
      std::forward<Args>(args)...);
  MP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace mp

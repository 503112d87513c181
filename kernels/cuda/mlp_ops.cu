// kernels/cuda/mlp_ops.cu: the MLP's element kernels (kernels/cuda/mlp_ops_cuda.h).
#include <algorithm>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mlp_ops_cuda.h"
#include "kernels/mlp_math.h"

namespace mp {
namespace {

__global__ void tanh_forward_kernel(float* y, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = tanhf(y[i]);
  }
}

__global__ void tanh_backward_kernel(const float* y, float* dy, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dy[i] = math::tanh_backward(dy[i], y[i]);
  }
}

}  // namespace

void mlp_tanh_forward_cuda(float* y, int64_t n, cudaStream_t stream) {
  MP_ENFORCE(n >= 0 && (n == 0 || y != nullptr), "tanh of ", n, " elements");
  if (n == 0) return;
  launch_kernel(&tanh_forward_kernel, cuda_launch::grid_stride("tanh_forward_kernel", n), stream, y, n);
}

void mlp_tanh_backward_cuda(const float* y, float* dy, int64_t n, cudaStream_t stream) {
  MP_ENFORCE(n >= 0 && (n == 0 || (y != nullptr && dy != nullptr)), "tanh backward of ", n, " elements");
  if (n == 0) return;
  launch_kernel(&tanh_backward_kernel, cuda_launch::grid_stride("tanh_backward_kernel", n), stream, y, dy, n);
}

}  // namespace mp

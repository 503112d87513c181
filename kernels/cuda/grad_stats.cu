// kernels/cuda/grad_stats.cu: sum of squares and NaN/Inf flag of a gradient
// shard, in two deterministic passes (per-block partials, then one block
// sums them in order). The element conversion is math::to_f32, shared with
// the CPU loop.
#include <algorithm>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/convert_math.h"
#include "kernels/cuda/grad_stats_cuda.h"
#include "kernels/cuda/launch.cuh"

namespace mp {
namespace {

constexpr int kThreads = cuda_launch::kThreads;
constexpr int64_t kMaxBlocks = cuda_launch::kGradStatsMaxBlocks;

struct Partial {
  double sum_sq;
  int32_t non_finite;
  int32_t pad_;
};

// Sums over the block in a fixed tree order.
__device__ void block_reduce(double& sum, int& bad) {
  __shared__ double s_sum[kThreads];
  __shared__ int s_bad[kThreads];
  s_sum[threadIdx.x] = sum;
  s_bad[threadIdx.x] = bad;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) {
      s_sum[threadIdx.x] += s_sum[threadIdx.x + width];
      s_bad[threadIdx.x] |= s_bad[threadIdx.x + width];
    }
    __syncthreads();
  }
  sum = s_sum[0];
  bad = s_bad[0];
}

template <class T>
__global__ void partials_kernel(const T* g, int64_t n, float multiplier, Partial* partials) {
  double sum = 0.0;
  int bad = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = math::to_f32(g[i]) * multiplier;
    bad |= (x - x) != 0.0f || x != x;  // NaN or Inf
    sum += static_cast<double>(x) * x;
  }
  block_reduce(sum, bad);
  if (threadIdx.x == 0) partials[blockIdx.x] = Partial{sum, bad, 0};
}

__global__ void finish_kernel(const Partial* partials, int count, DeviceGradStats* out) {
  double sum = 0.0;
  int bad = 0;
  for (int k = threadIdx.x; k < count; k += blockDim.x) {
    sum += partials[k].sum_sq;
    bad |= partials[k].non_finite;
  }
  block_reduce(sum, bad);
  if (threadIdx.x == 0) *out = DeviceGradStats{sum, bad, 0};
}

}  // namespace

int64_t grad_stats_cuda_workspace_bytes() { return kMaxBlocks * static_cast<int64_t>(sizeof(Partial)); }

void grad_stats_cuda(const void* grad, DType dtype, int64_t n, float multiplier, DeviceGradStats* out,
                     void* workspace, cudaStream_t stream) {
  MP_ENFORCE(!is_fp8(dtype), "gradient statistics of ", dtype_name(dtype), " are not supported");
  MP_ENFORCE(out != nullptr && workspace != nullptr, "gradient statistics without output or workspace");
  MP_ENFORCE(n == 0 || grad != nullptr, "gradient statistics of null memory");
  const LaunchConfig c = cuda_launch::grad_stats_partials(n);
  auto* partials = static_cast<Partial*>(workspace);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, fp8_e4m3> && !std::is_same_v<T, fp8_e5m2>) {
      launch_kernel(&partials_kernel<T>, c, stream, static_cast<const T*>(grad), n, multiplier, partials);
    }
  });
  launch_kernel(&finish_kernel, cuda_launch::grad_stats_finish(), stream, static_cast<const Partial*>(partials),
                static_cast<int>(c.grid.x), out);
}

}  // namespace mp

// kernels/cuda/newton_schulz.cu: Note [Newton-Schulz iteration] on the
// device. The element passes are newton_schulz_cpu's, one thread per
// element, through the same functions (kernels/newton_schulz_math.h,
// compiled with --fmad=false); the products are gemm_cuda's.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/convert_math.h"
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/cuda/grad_stats_cuda.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/newton_schulz_cuda.h"
#include "kernels/newton_schulz_math.h"

namespace mp {
namespace {

constexpr int64_t kAlignBytes = 256;

int64_t aligned(int64_t bytes) { return (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }

// Where the parts of the scratch lie, in bytes, for X [m, n] (m <= n).
struct Layout {
  int64_t m = 0, n = 0;
  int64_t x = 0, a = 0, b = 0, p = 0, stats = 0, workspace = 0, total = 0;
};

Layout layout_of(int64_t rows, int64_t cols, DType s) {
  Layout l;
  l.m = std::min(rows, cols);
  l.n = std::max(rows, cols);
  const int64_t e = static_cast<int64_t>(dtype_size(s));
  l.x = 0;
  l.a = l.x + aligned(l.m * l.n * e);
  l.b = l.a + aligned(l.m * l.m * e);
  l.p = l.b + aligned(l.m * l.m * e);
  l.stats = l.p + aligned(l.m * l.n * 4);
  l.workspace = l.stats + aligned(static_cast<int64_t>(sizeof(DeviceGradStats)));
  l.total = l.workspace + aligned(grad_stats_cuda_workspace_bytes());
  return l;
}

// X [m, n] = round_s(G), or round_s(G^T) for G [n, m].
template <class T>
__global__ void load_kernel(const float* g, T* x, int64_t m, int64_t n, bool transposed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m * n; i += stride) {
    const int64_t r = i / n, c = i % n;
    x[i] = math::from_f32<T>(transposed ? g[c * m + r] : g[i]);
  }
}

// out = X [m, n], or X^T [n, m].
template <class T>
__global__ void store_kernel(const T* x, float* out, int64_t m, int64_t n, bool transposed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m * n; i += stride) {
    const int64_t r = i / n, c = i % n;
    out[transposed ? c * m + r : i] = math::to_f32(x[i]);
  }
}

// X /= max(||X||_F, eps) (ns_divisor from the device statistics).
template <class T>
__global__ void scale_kernel(T* x, int64_t count, const DeviceGradStats* stats, double eps) {
  const float d = ns_divisor<T>(stats->sum_sq, stats->non_finite != 0, eps);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    x[i] = ns_scaled(x[i], d);
  }
}

template <class T>
__global__ void combine_b_kernel(const T* a, const float* p, T* b, int64_t count, float cb, float cc) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    b[i] = ns_combine_b(a[i], p[i], cb, cc);
  }
}

template <class T>
__global__ void combine_x_kernel(T* x, const float* p, int64_t count, float ca) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    x[i] = ns_combine_x(x[i], p[i], ca);
  }
}

template <class T>
void iterate(const float* g, float* out, int64_t rows, int64_t cols, const NewtonSchulzOptions& o, const Layout& l,
             char* scratch, cudaStream_t stream) {
  const DType s = o.dtype;
  const int64_t m = l.m, n = l.n;
  const bool transposed = rows > cols;
  T* x = reinterpret_cast<T*>(scratch + l.x);
  T* a = reinterpret_cast<T*>(scratch + l.a);
  T* b = reinterpret_cast<T*>(scratch + l.b);
  float* p = reinterpret_cast<float*>(scratch + l.p);
  auto* stats = reinterpret_cast<DeviceGradStats*>(scratch + l.stats);

  launch_kernel(&load_kernel<T>, cuda_launch::grid_stride("load_kernel", m * n), stream, g, x, m, n, transposed);
  grad_stats_cuda(x, s, m * n, 1.0f, stats, scratch + l.workspace, stream);
  launch_kernel(&scale_kernel<T>, cuda_launch::grid_stride("scale_kernel", m * n), stream, x, m * n, stats, o.eps);

  const float ca = static_cast<float>(o.a), cb = static_cast<float>(o.b), cc = static_cast<float>(o.c);
  const NsProducts q = ns_products(m, n, s, x, a, b, p);
  for (int step = 0; step < o.steps; ++step) {
    gemm_cuda(q.gram, stream);    // A = round_s(X X^T)
    gemm_cuda(q.square, stream);  // P = A A (fp32)
    launch_kernel(&combine_b_kernel<T>, cuda_launch::grid_stride("combine_b_kernel", m * m), stream, a, p, b, m * m, cb,
                  cc);
    gemm_cuda(q.apply, stream);  // P = B X (fp32)
    launch_kernel(&combine_x_kernel<T>, cuda_launch::grid_stride("combine_x_kernel", m * n), stream, x, p, m * n, ca);
  }
  launch_kernel(&store_kernel<T>, cuda_launch::grid_stride("store_kernel", m * n), stream, x, out, m, n, transposed);
}

}  // namespace

int64_t newton_schulz_cuda_scratch_bytes(int64_t rows, int64_t cols, const NewtonSchulzOptions& options) {
  check_newton_schulz(rows, cols, options);
  return layout_of(rows, cols, options.dtype).total;
}

void newton_schulz_cuda(const float* g, float* out, int64_t rows, int64_t cols, const NewtonSchulzOptions& options,
                        void* scratch, int64_t scratch_bytes, cudaStream_t stream) {
  check_newton_schulz(rows, cols, options);
  MP_ENFORCE(g != nullptr && out != nullptr && scratch != nullptr, "newton_schulz_cuda: null pointer");
  const Layout l = layout_of(rows, cols, options.dtype);
  MP_ENFORCE(scratch_bytes >= l.total, "newton_schulz_cuda: scratch of ", scratch_bytes, " bytes for a [", rows,
             ", ", cols, "] matrix in ", dtype_name(options.dtype), ", needs ", l.total);
  if (options.dtype == DType::kBF16) {
    iterate<bf16>(g, out, rows, cols, options, l, static_cast<char*>(scratch), stream);
  } else {
    iterate<float>(g, out, rows, cols, options, l, static_cast<char*>(scratch), stream);
  }
}

}  // namespace mp

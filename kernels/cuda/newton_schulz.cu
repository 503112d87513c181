// kernels/cuda/newton_schulz.cu: Note [Newton-Schulz iteration] on the
// device. The element passes are newton_schulz_cpu's loops, one thread per
// element, with __fmul_rn / __fadd_rn / __fdiv_rn so that nothing is
// contracted into an FMA; the products are gemm_cuda's.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/convert_math.h"
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/cuda/grad_stats_cuda.h"
#include "kernels/cuda/newton_schulz_cuda.h"

namespace mp {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kAlignBytes = 256;

int64_t aligned(int64_t bytes) { return (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }

// The iteration dtype's storage on the device: float, or bf16 bits.
template <class T>
__device__ __forceinline__ float widen(T v) {
  if constexpr (sizeof(T) == 4) {
    return v;
  } else {
    return math::bf16_bits_to_f32(v);
  }
}
template <class T>
__device__ __forceinline__ T narrow(float v) {
  if constexpr (sizeof(T) == 4) {
    return v;
  } else {
    return math::f32_to_bf16_bits(v);
  }
}

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

unsigned blocks_for(int64_t count) {
  return static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, 65535));
}

// X [m, n] = round_s(G), or round_s(G^T) for G [n, m].
template <class T>
__global__ void load_kernel(const float* g, T* x, int64_t m, int64_t n, bool transposed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m * n; i += stride) {
    const int64_t r = i / n, c = i % n;
    x[i] = narrow<T>(transposed ? g[c * m + r] : g[i]);
  }
}

// out = X [m, n], or X^T [n, m].
template <class T>
__global__ void store_kernel(const T* x, float* out, int64_t m, int64_t n, bool transposed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m * n; i += stride) {
    const int64_t r = i / n, c = i % n;
    out[transposed ? c * m + r : i] = widen(x[i]);
  }
}

// X /= max(||X||_F, eps): the norm from the device statistics, rounded to s
// as newton_schulz_cpu rounds it; `floor` is eps rounded to s.
template <class T>
__global__ void scale_kernel(T* x, int64_t count, const DeviceGradStats* stats, float floor) {
  const float norm = stats->non_finite != 0 ? __int_as_float(0x7fc00000)
                                            : widen(narrow<T>(static_cast<float>(sqrt(stats->sum_sq))));
  const float d = norm != norm ? norm : (norm < floor ? floor : norm);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    x[i] = narrow<T>(__fdiv_rn(widen(x[i]), d));
  }
}

// B = round_s(cb A + cc P).
template <class T>
__global__ void combine_b_kernel(const T* a, const float* p, T* b, int64_t count, float cb, float cc) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    b[i] = narrow<T>(__fadd_rn(__fmul_rn(cb, widen(a[i])), __fmul_rn(cc, p[i])));
  }
}

// X = round_s(ca X + P).
template <class T>
__global__ void combine_x_kernel(T* x, const float* p, int64_t count, float ca) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    x[i] = narrow<T>(__fadd_rn(__fmul_rn(ca, widen(x[i])), p[i]));
  }
}

float round_host(double v, DType s) {
  const float f = static_cast<float>(v);
  return s == DType::kBF16 ? math::bf16_bits_to_f32(math::f32_to_bf16_bits(f)) : f;
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

  load_kernel<T><<<blocks_for(m * n), kThreads, 0, stream>>>(g, x, m, n, transposed);
  MP_CHECK_CUDA(cudaGetLastError());
  grad_stats_cuda(x, s, m * n, 1.0f, stats, scratch + l.workspace, stream);
  scale_kernel<T><<<blocks_for(m * n), kThreads, 0, stream>>>(x, m * n, stats, round_host(o.eps, s));
  MP_CHECK_CUDA(cudaGetLastError());

  const float ca = static_cast<float>(o.a), cb = static_cast<float>(o.b), cc = static_cast<float>(o.c);
  GemmProblem gram = ns_gram_problem(m, n, s);
  gram.a.data = x;
  gram.b.data = x;
  gram.c = a;
  GemmProblem square = ns_square_problem(m, s);
  square.a.data = a;
  square.b.data = a;
  square.c = p;
  GemmProblem apply = ns_apply_problem(m, n, s);
  apply.a.data = b;
  apply.b.data = x;
  apply.c = p;
  for (int step = 0; step < o.steps; ++step) {
    gemm_cuda(gram, stream);    // A = round_s(X X^T)
    gemm_cuda(square, stream);  // P = A A (fp32)
    combine_b_kernel<T><<<blocks_for(m * m), kThreads, 0, stream>>>(a, p, b, m * m, cb, cc);
    MP_CHECK_CUDA(cudaGetLastError());
    gemm_cuda(apply, stream);   // P = B X (fp32)
    combine_x_kernel<T><<<blocks_for(m * n), kThreads, 0, stream>>>(x, p, m * n, ca);
    MP_CHECK_CUDA(cudaGetLastError());
  }
  store_kernel<T><<<blocks_for(m * n), kThreads, 0, stream>>>(x, out, m, n, transposed);
  MP_CHECK_CUDA(cudaGetLastError());
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
    iterate<uint16_t>(g, out, rows, cols, options, l, static_cast<char*>(scratch), stream);
  } else {
    iterate<float>(g, out, rows, cols, options, l, static_cast<char*>(scratch), stream);
  }
}

}  // namespace mp

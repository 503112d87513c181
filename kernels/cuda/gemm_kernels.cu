// kernels/cuda/gemm_kernels.cu: the GEMM's own kernels (kernels/cuda/
// gemm_kernels_cuda.h): grid-stride loops, one element per thread step.
#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/convert_loop.h"
#include "kernels/convert_math.h"
#include "kernels/cuda/gemm_kernels_cuda.h"
#include "kernels/gpt_math.h"

namespace mp {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

template <class T>
__global__ void pack_fp32_kernel(const T* src, int64_t src_ld, int64_t rows, int64_t cols, float* dst) {
  const int64_t n = rows * cols, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / cols, c = i % cols;
    dst[i] = math::to_f32(src[r * src_ld + c]);
  }
}

template <class Out>
__device__ __forceinline__ Out store_as(float v, bool round) {
  if constexpr (std::is_same_v<Out, bf16>) {
    (void)round;
    return bf16{math::f32_to_bf16_bits(v)};
  } else {
    return round ? math::round_through_unit<bf16>(v) : v;
  }
}

// The epilogue arguments a kernel needs (GemmProblem, less the inputs).
struct EpilogueArgs {
  int64_t m, n;
  const float* product;  // [m, n], ld n; null: zeros
  const float* bias;
  const float* addend;
  void* c;
  int64_t ldc;
  bool accumulate, round;
  GemmEpilogue epilogue;
  void* aux;
  int64_t aux_ld;
};

template <class Out>
__global__ void epilogue_kernel(EpilogueArgs a) {
  const int64_t count = a.m * a.n, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < count; idx += stride) {
    const int64_t i = idx / a.n, j = idx % a.n;
    float v = a.product != nullptr ? a.product[idx] : 0.0f;
    if (a.bias != nullptr) v += a.bias[j];
    if (a.addend != nullptr) v += a.addend[i * a.ldc + j];
    Out* c = static_cast<Out*>(a.c) + i * a.ldc + j;
    if (a.accumulate) v += math::to_f32(*c);
    if (a.epilogue == GemmEpilogue::kGelu) {
      static_cast<Out*>(a.aux)[i * a.aux_ld + j] = store_as<Out>(v, a.round);
      v = math::gelu(v);
    } else if (a.epilogue == GemmEpilogue::kDGelu) {
      v = v * math::gelu_grad(math::to_f32(static_cast<const Out*>(a.aux)[i * a.aux_ld + j]));
    }
    *c = store_as<Out>(v, a.round);
  }
}

template <class T>
__global__ void bias_grad_kernel(const T* b, int64_t k_step, int64_t j_step, int64_t k, int64_t n, float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    float s = 0.0f;
    for (int64_t kk = 0; kk < k; ++kk) s += math::to_f32(b[kk * k_step + j * j_step]);
    out[j] = s;
  }
}

}  // namespace

void gemm_pack_fp32_cuda(const void* src, DType dtype, int64_t ld, int64_t rows, int64_t cols, float* dst,
                         cudaStream_t stream) {
  if (rows * cols == 0) return;
  if (dtype == DType::kBF16) {
    pack_fp32_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(static_cast<const bf16*>(src), ld, rows, cols,
                                                                       dst);
  } else {
    pack_fp32_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(static_cast<const float*>(src), ld, rows, cols,
                                                                       dst);
  }
  MP_CHECK_CUDA(cudaGetLastError());
}

void gemm_epilogue_cuda(const GemmProblem& p, const float* product, cudaStream_t stream) {
  if (p.m * p.n == 0) return;
  const EpilogueArgs a{p.m,         p.n,        product, p.bias,     p.addend, p.c,     p.ldc, p.accumulate,
                       p.bf16_output(), p.epilogue, p.aux, p.aux_ld};
  if (p.c_dtype == DType::kBF16) {
    epilogue_kernel<bf16><<<blocks_for(p.m * p.n), kThreads, 0, stream>>>(a);
  } else {
    epilogue_kernel<float><<<blocks_for(p.m * p.n), kThreads, 0, stream>>>(a);
  }
  MP_CHECK_CUDA(cudaGetLastError());
}

void gemm_bias_grad_cuda(const GemmProblem& p, cudaStream_t stream) {
  if (p.n == 0) return;
  // op(B)[k, j] is B[k, j], or B[j, k] when transposed.
  const int64_t k_step = p.b.transposed ? 1 : p.b.ld, j_step = p.b.transposed ? p.b.ld : 1;
  if (p.b.dtype == DType::kBF16) {
    bias_grad_kernel<<<blocks_for(p.n), kThreads, 0, stream>>>(static_cast<const bf16*>(p.b.data), k_step, j_step,
                                                               p.k, p.n, p.bias_grad);
  } else {
    bias_grad_kernel<<<blocks_for(p.n), kThreads, 0, stream>>>(static_cast<const float*>(p.b.data), k_step, j_step,
                                                               p.k, p.n, p.bias_grad);
  }
  MP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace mp

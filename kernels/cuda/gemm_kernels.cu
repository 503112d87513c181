// kernels/cuda/gemm_kernels.cu: the GEMM's own kernels (kernels/cuda/
// gemm_kernels_cuda.h): grid-stride loops, one element per thread step.
#include <algorithm>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/convert_loop.h"
#include "kernels/convert_math.h"
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/gemm_kernels_cuda.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/packed.cuh"
#include "kernels/gpt_math.h"

namespace mp {
namespace {

using cuda_packed::from_f32;

template <class T>
__global__ void pack_fp32_kernel(const T* src, int64_t src_ld, int64_t rows, int64_t cols, float* dst) {
  const int64_t n = rows * cols, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / cols, c = i % cols;
    dst[i] = math::to_f32(src[r * src_ld + c]);
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
      static_cast<Out*>(a.aux)[i * a.aux_ld + j] = from_f32<Out>(v, a.round);
      v = math::gelu(v);
    } else if (a.epilogue == GemmEpilogue::kDGelu) {
      v = v * math::gelu_grad(math::to_f32(static_cast<const Out*>(a.aux)[i * a.aux_ld + j]));
    }
    *c = from_f32<Out>(v, a.round);
  }
}

// op(B)[k, j]: B[k, j], or B[j, k] when transposed.
template <class T>
struct BiasGradTerm {
  const T* b;
  int64_t k_step, j_step;
  __device__ void operator()(int64_t k, int64_t j, float* acc) const {
    acc[0] += math::to_f32(b[k * k_step + j * j_step]);
  }
};

template <class T>
void bias_grad(const GemmProblem& p, void* workspace, cudaStream_t stream) {
  const int64_t k_step = p.b.transposed ? 1 : p.b.ld, j_step = p.b.transposed ? p.b.ld : 1;
  cuda_column::column_sums<1>(BiasGradTerm<T>{static_cast<const T*>(p.b.data), k_step, j_step}, p.k, p.n,
                              cuda_column::Outputs{{p.bias_grad, nullptr}}, workspace, stream);
}

}  // namespace

void gemm_pack_fp32_cuda(const void* src, DType dtype, int64_t ld, int64_t rows, int64_t cols, float* dst,
                         cudaStream_t stream) {
  if (rows * cols == 0) return;
  if (dtype == DType::kBF16) {
    launch_kernel(&pack_fp32_kernel<bf16>, cuda_launch::grid_stride("pack_fp32_kernel", rows * cols), stream,
                  static_cast<const bf16*>(src), ld, rows, cols, dst);
  } else {
    launch_kernel(&pack_fp32_kernel<float>, cuda_launch::grid_stride("pack_fp32_kernel", rows * cols), stream,
                  static_cast<const float*>(src), ld, rows, cols, dst);
  }
}

void gemm_epilogue_cuda(const GemmProblem& p, const float* product, cudaStream_t stream) {
  if (p.m * p.n == 0) return;
  const EpilogueArgs a{p.m,         p.n,        product, p.bias,     p.addend, p.c,     p.ldc, p.accumulate,
                       p.bf16_output(), p.epilogue, p.aux, p.aux_ld};
  if (p.c_dtype == DType::kBF16) {
    launch_kernel(&epilogue_kernel<bf16>, cuda_launch::grid_stride("epilogue_kernel", p.m * p.n), stream, a);
  } else {
    launch_kernel(&epilogue_kernel<float>, cuda_launch::grid_stride("epilogue_kernel", p.m * p.n), stream, a);
  }
}

int64_t gemm_bias_grad_cuda_workspace_bytes(const GemmProblem& p) { return cuda_column::workspace_bytes(p.k, p.n, 1); }

void gemm_bias_grad_cuda(const GemmProblem& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0) return;
  if (p.b.dtype == DType::kBF16) {
    bias_grad<bf16>(p, workspace, stream);
  } else {
    bias_grad<float>(p, workspace, stream);
  }
}

}  // namespace mp

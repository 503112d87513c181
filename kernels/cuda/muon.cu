// kernels/cuda/muon.cu: Muon's element passes (kernels/cuda/muon_cuda.h),
// one thread per element; compiled with --fmad=false (kernels/CMakeLists.txt).
#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/convert_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/muon_cuda.h"
#include "kernels/remainder_math.h"

namespace mp {
namespace {

template <class G>
__global__ void momentum_kernel(const G* grad, float* momentum, float* u, int64_t n, float multiplier,
                                MuonMomentum c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = math::to_f32(grad[i]);
    float buf = momentum[i];
    u[i] = muon_momentum_element(buf, multiplier == 1.0f ? g : g * multiplier, c);
    momentum[i] = buf;
  }
}

template <class P>
__global__ void apply_master_kernel(float* master, P* param_out, const float* o, int64_t n, MuonApply c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float p = muon_apply_element(master[i], o[i], c);
    master[i] = p;
    if (param_out != nullptr) param_out[i] = math::from_f32<P>(p);
  }
}

__global__ void apply_remainder_kernel(uint16_t* high, int16_t* remainder, const float* o, int64_t n, MuonApply c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float p = muon_apply_element(math::merge_bf16_remainder(high[i], remainder[i]), o[i], c);
    const math::Bf16Remainder split = math::split_bf16_remainder(p);
    high[i] = split.h;
    remainder[i] = split.r;
  }
}

}  // namespace

void muon_momentum_cuda(const void* grad, DType grad_dtype, float* momentum, float* u, int64_t n, float multiplier,
                        const MuonMomentum& c, cudaStream_t stream) {
  MP_ENFORCE(grad_dtype == DType::kF32 || grad_dtype == DType::kBF16 || grad_dtype == DType::kF16,
             "muon momentum of a ", dtype_name(grad_dtype), " gradient");
  if (n == 0) return;
  MP_ENFORCE(grad != nullptr && momentum != nullptr && u != nullptr, "muon momentum: null pointer");
  dispatch_dtype(grad_dtype, [&](auto tag) {
    using G = decltype(tag);
    if constexpr (std::is_same_v<G, float> || std::is_same_v<G, bf16> || std::is_same_v<G, fp16>) {
      launch_kernel(&momentum_kernel<G>, cuda_launch::grid_stride("momentum_kernel", n), stream,
                    static_cast<const G*>(grad), momentum, u, n, multiplier, c);
    }
  });
}

void muon_apply_cuda(float* master, int16_t* remainder, void* param_out, DType param_dtype, const float* o,
                     int64_t n, const MuonApply& c, cudaStream_t stream) {
  if (n == 0) return;
  MP_ENFORCE(o != nullptr, "muon apply: null update");
  if (master == nullptr) {
    MP_ENFORCE(remainder != nullptr && param_out != nullptr && param_dtype == DType::kBF16,
               "muon apply: without an fp32 master, bf16 params and their remainders");
    launch_kernel(&apply_remainder_kernel, cuda_launch::grid_stride("apply_remainder_kernel", n), stream,
                  static_cast<uint16_t*>(param_out), remainder, o, n, c);
  } else {
    MP_ENFORCE(param_dtype == DType::kF32 || param_dtype == DType::kBF16 || param_dtype == DType::kF16,
               "muon apply: ", dtype_name(param_dtype), " params");
    dispatch_dtype(param_dtype, [&](auto tag) {
      using P = decltype(tag);
      if constexpr (std::is_same_v<P, float> || std::is_same_v<P, bf16> || std::is_same_v<P, fp16>) {
        launch_kernel(&apply_master_kernel<P>, cuda_launch::grid_stride("apply_master_kernel", n), stream, master,
                      static_cast<P*>(param_out), o, n, c);
      }
    });
  }
}

}  // namespace mp

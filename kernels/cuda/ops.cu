// kernels/cuda/ops.cu: the CUDA bodies of the engine's element ops
// (kernels/cuda/ops_cuda.h). Grid-stride kernels over the same element math
// as the CPU loops (kernels/accumulate_math.h), so both give the same bits.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/accumulate_math.h"
#include "kernels/convert_loop.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace mp {
namespace {

#define MP_GRID_STRIDE(i, n)                                                                        \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);             \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void fill_u32_kernel(uint32_t* p, uint32_t bits, int64_t n) {
  MP_GRID_STRIDE(i, n) p[i] = bits;
}
__global__ void fill_u16_kernel(uint16_t* p, uint16_t bits, int64_t n) {
  MP_GRID_STRIDE(i, n) p[i] = bits;
}

template <class D, class S>
__global__ void accumulate_kernel(D* dst, const S* src, int64_t n, bool overwrite) {
  MP_GRID_STRIDE(i, n) dst[i] = math::accumulate_into(dst[i], src[i], overwrite);
}

__global__ void accumulate_f64_kernel(double* acc, const float* src, int blocks, int64_t n, bool first) {
  MP_GRID_STRIDE(i, n) {
    double a = first ? 0.0 : acc[i];
    for (int k = 0; k < blocks; ++k) a = math::add_f64(a, src[k * n + i]);
    acc[i] = a;
  }
}

__global__ void round_f64_kernel(const double* acc, float* out, int64_t n) {
  MP_GRID_STRIDE(i, n) out[i] = static_cast<float>(acc[i]);
}

template <class W>
__global__ void round_through_kernel(const float* src, float* dst, int64_t n, math::ConvertParams p) {
  MP_GRID_STRIDE(i, n) dst[i] = math::round_through_element<W>(src[i], p);
}

template <class T>
constexpr bool kAccumulable = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

// Writes far past the end of the address space's first page: no allocation is there.
__global__ void device_fault_kernel(uint32_t* bad) { bad[threadIdx.x] = 0xdeadbeefu; }

}  // namespace

void device_fault_cuda(cudaStream_t stream) {
  launch_kernel(&device_fault_kernel, cuda_launch::device_fault(), stream,
                reinterpret_cast<uint32_t*>(uintptr_t{0x10}));
}

void fill_nan_cuda(void* data, DType dtype, int64_t n, cudaStream_t stream) {
  MP_ENFORCE(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16, "fill_nan of ", dtype_name(dtype));
  if (n <= 0) return;
  if (dtype == DType::kF32) {
    launch_kernel(&fill_u32_kernel, cuda_launch::grid_stride("fill_u32_kernel", n), stream,
                  static_cast<uint32_t*>(data), math::kQuietNanF32Bits, n);
  } else {
    const uint16_t bits = dtype == DType::kBF16 ? math::kQuietNanBf16Bits : math::kQuietNanF16Bits;
    launch_kernel(&fill_u16_kernel, cuda_launch::grid_stride("fill_u16_kernel", n), stream,
                  static_cast<uint16_t*>(data), bits, n);
  }
}

void accumulate_cuda(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n, bool overwrite,
                     cudaStream_t stream) {
  if (n <= 0) return;
  bool launched = false;
  dispatch_dtype(dst_dtype, [&](auto dtag) {
    dispatch_dtype(src_dtype, [&](auto stag) {
      using D = decltype(dtag);
      using S = decltype(stag);
      if constexpr (kAccumulable<D> && kAccumulable<S>) {
        launch_kernel(&accumulate_kernel<D, S>, cuda_launch::grid_stride("accumulate_kernel", n), stream,
                      static_cast<D*>(dst), static_cast<const S*>(src), n, overwrite);
        launched = true;
      }
    });
  });
  MP_ENFORCE(launched, "accumulate ", dtype_name(src_dtype), " into ", dtype_name(dst_dtype),
             ": fp32, bf16 or fp16 only");
}

void accumulate_f64_cuda(double* acc, const float* src, int blocks, int64_t n, bool first, cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(&accumulate_f64_kernel, cuda_launch::grid_stride("accumulate_f64_kernel", n), stream, acc, src, blocks,
                n, first);
}

void round_f64_cuda(const double* acc, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(&round_f64_kernel, cuda_launch::grid_stride("round_f64_kernel", n), stream, acc, out, n);
}

void round_through_cuda(const float* src, float* dst, DType through, double divisor, int64_t n,
                        cudaStream_t stream) {
  if (n <= 0) return;
  const math::ConvertParams p = math::make_convert_params(0, 0, 0, divisor);
  bool launched = false;
  dispatch_dtype(through, [&](auto tag) {
    using W = decltype(tag);
    if constexpr (kAccumulable<W>) {
      launch_kernel(&round_through_kernel<W>, cuda_launch::grid_stride("round_through_kernel", n), stream, src, dst, n,
                    p);
      launched = true;
    }
  });
  MP_ENFORCE(launched, "round_through through ", dtype_name(through), ": fp32, bf16 or fp16 only");
}

}  // namespace mp

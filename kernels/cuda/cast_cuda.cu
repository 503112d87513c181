// kernels/cuda/cast_cuda.cu: the model's casts on a CUDA device
// (kernels/cuda/cast_cuda.h): a grid-stride kernel per conversion, eight
// elements per thread per step (16-byte accesses of bf16, two of fp32)
// where every pointer is 16-byte aligned, else one.
#include <algorithm>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/packed.cuh"

namespace mp {
namespace {

using cuda_packed::aligned16;
using cuda_packed::from_f32;
using cuda_packed::to_f32;

constexpr int64_t kMaxBlocks = 8192;
constexpr int kVec = 8;

template <class T>
struct alignas(16) Vec8 {
  T v[kVec];
};

// dst[i] := src[i] as Dst stores it; vector steps of eight, then the tail.
template <class Src, class Dst>
__global__ void convert_kernel(const Src* src, Dst* dst, int64_t n, bool round, bool vector) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t tail = 0;
  if (vector) {
    const int64_t steps = n / kVec;
    for (int64_t s = first; s < steps; s += stride) {
      const Vec8<Src> in = reinterpret_cast<const Vec8<Src>*>(src)[s];
      Vec8<Dst> out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) out.v[k] = from_f32<Dst>(to_f32(in.v[k]), round);
      reinterpret_cast<Vec8<Dst>*>(dst)[s] = out;
    }
    tail = steps * kVec;
  }
  for (int64_t i = tail + first; i < n; i += stride) dst[i] = from_f32<Dst>(to_f32(src[i]), round);
}

template <class Src, class Dst>
void launch_convert(const void* src, void* dst, int64_t n, bool round, cudaStream_t stream) {
  const bool vector = aligned16(src) && aligned16(dst);
  launch_kernel(&convert_kernel<Src, Dst>,
                cuda_launch::grid_stride("convert_kernel", vector ? n / kVec + 1 : n, kMaxBlocks), stream,
                static_cast<const Src*>(src), static_cast<Dst*>(dst), n, round, vector);
}

struct Ranges {
  int64_t begin[kMaxWidenRanges];
  int64_t offset[kMaxWidenRanges + 1];  // elements before range r, over all ranges
  int count;
};

template <class Src>
__global__ void widen_ranges_kernel(const Src* src, float* dst, Ranges r) {
  const int64_t total = r.offset[r.count];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int k = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    while (i >= r.offset[k + 1]) ++k;  // a thread's indices increase
    const int64_t e = r.begin[k] + (i - r.offset[k]);
    dst[e] = math::to_f32(src[e]);
  }
}

void check_act(const Act& a, const char* what) {
  MP_ENFORCE(a.data != nullptr && (a.dtype == DType::kF32 || (a.dtype == DType::kBF16 && a.bf16)), what, " stored as ",
             dtype_name(a.dtype), a.data == nullptr ? " (null)" : "");
}

}  // namespace

void gpt_convert_cuda(Act src, Act dst, int64_t n, cudaStream_t stream) {
  MP_ENFORCE(n >= 0, "conversion of ", n, " values");
  if (n == 0) return;
  check_act(src, "conversion source");
  check_act(dst, "conversion destination");
  if (src.dtype == DType::kBF16) {
    if (dst.dtype == DType::kBF16) {
      MP_CHECK_CUDA(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(n) * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, stream));
    } else {
      launch_convert<bf16, float>(src.data, dst.data, n, false, stream);
    }
  } else if (dst.dtype == DType::kBF16) {
    launch_convert<float, bf16>(src.data, dst.data, n, true, stream);
  } else if (dst.bf16 && !src.bf16) {
    launch_convert<float, float>(src.data, dst.data, n, true, stream);
  } else {
    MP_CHECK_CUDA(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(n) * sizeof(float),
                                  cudaMemcpyDeviceToDevice, stream));
  }
}

void gpt_round_to_bf16_cuda(const float* x, int64_t n, DType storage, void* out, cudaStream_t stream) {
  MP_ENFORCE(storage == DType::kBF16 || storage == DType::kF32, "bf16 values stored as ", dtype_name(storage));
  MP_ENFORCE(n >= 0 && (n == 0 || (x != nullptr && out != nullptr)), "round to bf16 of ", n, " values");
  if (n == 0) return;
  if (storage == DType::kBF16) {
    launch_convert<float, bf16>(x, out, n, true, stream);
  } else {
    launch_convert<float, float>(x, out, n, true, stream);
  }
}

void widen_ranges_cuda(const void* src, DType src_dtype, float* dst, const int64_t* begins, const int64_t* ends,
                       int count, cudaStream_t stream) {
  MP_ENFORCE(count >= 0 && count <= kMaxWidenRanges, "widening ", count, " ranges (at most ", kMaxWidenRanges, ")");
  Ranges r{};
  r.count = count;
  for (int k = 0; k < count; ++k) {
    MP_ENFORCE(begins[k] >= 0 && begins[k] <= ends[k], "widening range [", begins[k], ", ", ends[k], ")");
    r.begin[k] = begins[k];
    r.offset[k + 1] = r.offset[k] + (ends[k] - begins[k]);
  }
  const int64_t total = r.offset[count];
  if (total == 0) return;
  MP_ENFORCE(src != nullptr && dst != nullptr, "widening null memory");
  const LaunchConfig c = cuda_launch::grid_stride("widen_ranges_kernel", total, kMaxBlocks);
  switch (src_dtype) {
    case DType::kF32:
      launch_kernel(&widen_ranges_kernel<float>, c, stream, static_cast<const float*>(src), dst, r);
      break;
    case DType::kBF16:
      launch_kernel(&widen_ranges_kernel<bf16>, c, stream, static_cast<const bf16*>(src), dst, r);
      break;
    case DType::kF16:
      launch_kernel(&widen_ranges_kernel<fp16>, c, stream, static_cast<const fp16*>(src), dst, r);
      break;
    default:
      MP_THROW(EnforceError, "widening ", dtype_name(src_dtype), " parameters");
  }
}

}  // namespace mp

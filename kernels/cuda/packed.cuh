// kernels/cuda/packed.cuh: what the streaming kernels (LayerNorm, the
// classifier, casts) share: 16-byte accesses (Packed128 holds 4 fp32 or 8
// bf16 values, one LDG.128 / STG.128), element conversions through the
// shared math of kernels/convert_math.h, and fixed-tree block reductions
// (the same inputs give the same bits). CUDA sources only.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/convert_loop.h"
#include "kernels/convert_math.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace mp::cuda_packed {

template <class T>
struct alignas(16) Packed128 {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  T v[kSize];
};

template <class T>
__device__ __forceinline__ Packed128<T> load128(const T* p) {
  return *reinterpret_cast<const Packed128<T>*>(p);
}
// Read once, not kept in L1 (data the kernel streams through).
template <class T>
__device__ __forceinline__ Packed128<T> load128cs(const T* p) {
  Packed128<T> out;
  const int4 raw = __ldcs(reinterpret_cast<const int4*>(p));
  memcpy(&out, &raw, sizeof(out));
  return out;
}
template <class T>
__device__ __forceinline__ void store128(T* p, const Packed128<T>& v) {
  *reinterpret_cast<Packed128<T>*>(p) = v;
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return math::to_f32(x); }

// v as an element of T: bf16 rounded to nearest even; fp32 as it is, or
// rounded through bf16 where it holds bf16 values (round).
template <class T>
__device__ __forceinline__ T from_f32(float v, bool round) {
  if constexpr (std::is_same_v<T, bf16>) {
    (void)round;
    return bf16{math::f32_to_bf16_bits(v)};
  } else {
    return round ? math::round_through_unit<bf16>(v) : v;
  }
}

__host__ __device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Block reductions, blockDim.x a multiple of 32 and at most 1024: each
// warp's butterfly, then every warp reduces the warps' results in the same
// order; every thread gets the result. block_sum of float or double.
template <class T>
__device__ __forceinline__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  v = cuda_warp::warp_sum(v);
  __syncthreads();  // an earlier reduction may still read `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x) / 32 ? partial[lane] : T{0};
  return cuda_warp::warp_sum(v);
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  v = cuda_warp::warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x) / 32 ? partial[lane] : -INFINITY;
  return cuda_warp::warp_max(v);
}

}  // namespace mp::cuda_packed

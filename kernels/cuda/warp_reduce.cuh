// kernels/cuda/warp_reduce.cuh: butterfly (xor) reductions across a full
// warp: every lane combines the same pairs (a + b == b + a exactly), so all
// lanes end with the same bits (a fixed tree: the same inputs give the same
// result). For the flash attention, LayerNorm and the block reductions of
// packed.cuh; CUDA sources only.
#pragma once

namespace mp::cuda_warp {

inline constexpr int kWarp = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

template <class T>  // float or double
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

}  // namespace mp::cuda_warp

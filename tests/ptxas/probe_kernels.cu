// tests/ptxas/probe_kernels.cu: kernels that exist only to show that the
// stack and spill check (tests/check_ptxas.py) catches what it is for. Never
// launched; compiled for sm_90 with the report of cmake/MpPtxasReport.cmake.
#include <cstdint>

namespace mp::probe {

// A local array indexed at run time lives in local memory: a stack frame.
// (Its entries are running sums, so ptxas cannot load the one picked.)
__global__ void local_array_kernel(const float* in, float* out, int pick) {
  float a[64];
  float sum = 0.0f;
  for (int i = 0; i < 64; ++i) {
    sum += in[i * blockDim.x + threadIdx.x];
    a[i] = sum;
  }
  out[threadIdx.x] = a[(pick + threadIdx.x) & 63];
}

// 40 values live at once under a cap of 32 registers: ptxas spills them.
// `out` may alias `in`, so the values cannot be loaded again after a store.
__global__ void __maxnreg__(32) spilling_kernel(const float* in, float* out) {
  constexpr int kLive = 40;
  float v[kLive];
#pragma unroll
  for (int i = 0; i < kLive; ++i) v[i] = in[i * blockDim.x + threadIdx.x];
#pragma unroll
  for (int k = 0; k < kLive; ++k) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kLive; ++i) s += v[i] * v[(i + k) % kLive];
    out[k * blockDim.x + threadIdx.x] = s;
  }
}

// 16-byte loads and stores, all in registers: what a hot kernel looks like.
__global__ void clean_kernel(const float4* in, float4* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 x = in[i];
    out[i] = make_float4(x.x * 2.0f, x.y * 2.0f, x.z * 2.0f, x.w * 2.0f);
  }
}

}  // namespace mp::probe

// kernels/cuda/layernorm_cuda.cu: LayerNorm forward and backward (Note
// [LayerNorm kernels] in layernorm_cuda.h): the kernels, then their
// launchers.
#include <algorithm>
#include <initializer_list>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/cuda/layernorm_cuda.h"
#include "kernels/cuda/packed.cuh"
#include "kernels/gpt_math.h"

namespace mp {
namespace {

using cuda_packed::block_sum;
using cuda_packed::from_f32;
using cuda_packed::load128;
using cuda_packed::load128cs;
using cuda_packed::Packed128;
using cuda_packed::store128;
using cuda_packed::to_f32;
using cuda_warp::warp_sum;

constexpr float kEps = static_cast<float>(math::kGptLayerNormEps);
constexpr int kLnWarps = 8;           // per block, both kernels
constexpr int kLnThreads = 32 * kLnWarps;
constexpr int kLnRowsPerWarp = 4;     // backward
constexpr int kVec = 8;               // elements per lane per 16-byte step (8 bf16, 2 x 4 fp32)

// Eight consecutive fp32 values, as two 16-byte loads.
struct F8 {
  float v[kVec];
};
__device__ __forceinline__ F8 load8(const float* p) {
  const Packed128<float> a = load128(p), b = load128(p + 4);
  F8 out;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    out.v[k] = a.v[k];
    out.v[k + 4] = b.v[k];
  }
  return out;
}
__device__ __forceinline__ void store8(float* p, const F8& x) {
  Packed128<float> a, b;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    a.v[k] = x.v[k];
    b.v[k] = x.v[k + 4];
  }
  store128(p, a);
  store128(p + 4, b);
}
// Eight values of T widened (fp32: two loads; bf16: one).
template <class T>
__device__ __forceinline__ F8 load8_as_f32(const T* p) {
  if constexpr (std::is_same_v<T, bf16>) {
    const Packed128<bf16> a = load128cs(p);
    F8 out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = to_f32(a.v[k]);
    return out;
  } else {
    return load8(p);
  }
}
template <class T>
__device__ __forceinline__ void store8_from_f32(T* p, const F8& x, bool round) {
  if constexpr (std::is_same_v<T, bf16>) {
    Packed128<bf16> a;
#pragma unroll
    for (int k = 0; k < kVec; ++k) a.v[k] = from_f32<bf16>(x.v[k], round);
    store128(p, a);
  } else {
    F8 y;
#pragma unroll
    for (int k = 0; k < kVec; ++k) y.v[k] = from_f32<float>(x.v[k], round);
    store8(p, y);
  }
}

// ---- forward ---------------------------------------------------------------------

// One warp per row; kVector: channels % 8 == 0 and 16-byte aligned rows.
template <class Out, bool kVector>
__global__ void __launch_bounds__(kLnThreads)
    layernorm_forward_kernel(const float* x, const float* w, const float* b, int64_t rows, int channels, Out* out,
                             bool round, float* mean, float* rstd) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kLnWarps + static_cast<int>(threadIdx.x) / 32;
  if (row >= rows) return;
  const float* xr = x + row * channels;
  const float inv_c = 1.0f / static_cast<float>(channels);
  float s = 0.0f;
  if constexpr (kVector) {
    for (int j = lane * kVec; j < channels; j += 32 * kVec) {
      const F8 v = load8(xr + j);
#pragma unroll
      for (int k = 0; k < kVec; ++k) s += v.v[k];
    }
  } else {
    for (int j = lane; j < channels; j += 32) s += xr[j];
  }
  const float m = warp_sum(s) * inv_c;
  float s2 = 0.0f;
  if constexpr (kVector) {
    for (int j = lane * kVec; j < channels; j += 32 * kVec) {
      const F8 v = load8(xr + j);
#pragma unroll
      for (int k = 0; k < kVec; ++k) s2 += (v.v[k] - m) * (v.v[k] - m);
    }
  } else {
    for (int j = lane; j < channels; j += 32) s2 += (xr[j] - m) * (xr[j] - m);
  }
  const float r = 1.0f / sqrtf(warp_sum(s2) * inv_c + kEps);
  Out* o = out + row * channels;
  if constexpr (kVector) {
    for (int j = lane * kVec; j < channels; j += 32 * kVec) {
      const F8 v = load8(xr + j), wv = load8(w + j), bv = load8(b + j);
      F8 y;
#pragma unroll
      for (int k = 0; k < kVec; ++k) y.v[k] = math::layernorm(v.v[k], m, r, wv.v[k], bv.v[k]);
      store8_from_f32(o + j, y, round);
    }
  } else {
    for (int j = lane; j < channels; j += 32) o[j] = from_f32<Out>(math::layernorm(xr[j], m, r, w[j], b[j]), round);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// ---- backward --------------------------------------------------------------------

// The workspace: the blocks' partial rows [blocks, 2 channels] (dw then
// db), then the counter.
struct LnWorkspace {
  float* partials;
  unsigned* counter;
};

int64_t backward_blocks(int64_t rows) {
  const int64_t rows_per_block = int64_t{kLnWarps} * kLnRowsPerWarp;
  return std::max<int64_t>(1, (rows + rows_per_block - 1) / rows_per_block);
}

LnWorkspace workspace_of(void* base, int64_t rows, int64_t channels) {
  auto* partials = static_cast<float*>(base);
  const int64_t floats = backward_blocks(rows) * 2 * channels;
  return LnWorkspace{partials, reinterpret_cast<unsigned*>(partials + (floats + 63) / 64 * 64)};
}

// dx (and its copy) of one row, and its dw, db terms added into the warp's
// shared row (sw: dw, sb: db).
template <class In, class Copy, bool kVector>
__device__ __forceinline__ void layernorm_backward_row(const In* g, const float* xr, const float* w, float m, float r,
                                                       int channels, float* dxr, bool accumulate, Copy* copy,
                                                       bool round, float* sw, float* sb) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const float inv_c = 1.0f / static_cast<float>(channels);
  float a = 0.0f, c = 0.0f;  // sums of w g and of w g norm
  if constexpr (kVector) {
    for (int j = lane * kVec; j < channels; j += 32 * kVec) {
      const F8 gv = load8_as_f32(g + j), xv = load8(xr + j), wv = load8(w + j);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float wg = wv.v[k] * gv.v[k];
        a += wg;
        c += wg * ((xv.v[k] - m) * r);
      }
    }
  } else {
    for (int j = lane; j < channels; j += 32) {
      const float wg = w[j] * to_f32(g[j]);
      a += wg;
      c += wg * ((xr[j] - m) * r);
    }
  }
  const float dnorm_mean = warp_sum(a) * inv_c, dnorm_norm_mean = warp_sum(c) * inv_c;
  if constexpr (kVector) {
    for (int j = lane * kVec; j < channels; j += 32 * kVec) {
      const F8 gv = load8_as_f32(g + j), xv = load8(xr + j), wv = load8(w + j);
      F8 d = accumulate ? load8(dxr + j) : F8{};
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float norm = (xv.v[k] - m) * r;
        const float v = math::layernorm_dx(xv.v[k], m, r, wv.v[k] * gv.v[k], dnorm_mean, dnorm_norm_mean);
        d.v[k] = accumulate ? d.v[k] + v : v;
        sw[j + k] += gv.v[k] * norm;
        sb[j + k] += gv.v[k];
      }
      store8(dxr + j, d);
      if (copy != nullptr) store8_from_f32(copy + j, d, round);
    }
  } else {
    for (int j = lane; j < channels; j += 32) {
      const float gj = to_f32(g[j]), norm = (xr[j] - m) * r;
      const float v = math::layernorm_dx(xr[j], m, r, w[j] * gj, dnorm_mean, dnorm_norm_mean);
      const float d = accumulate ? dxr[j] + v : v;
      dxr[j] = d;
      if (copy != nullptr) copy[j] = from_f32<Copy>(d, round);
      sw[j] += gj * norm;
      sb[j] += gj;
    }
  }
}

// At most 2 kLnWarps channels floats of shared memory per block bound the
// blocks per SM anyway: the registers may be plenty (one block's worth).
template <class In, class Copy, bool kVector>
__global__ void __launch_bounds__(kLnThreads, 1)
    layernorm_backward_kernel(const In* dout, const float* x, const float* w, const float* mean, const float* rstd,
                              int64_t rows, int channels, float* dx, bool accumulate, Copy* copy, bool round,
                              float* dw, float* db, LnWorkspace ws) {
  extern __shared__ float warp_rows[];  // [kLnWarps][2 channels]
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int two_c = 2 * channels;
  float* sw = warp_rows + warp * two_c;
  float* sb = sw + channels;
  for (int j = lane; j < two_c; j += 32) sw[j] = 0.0f;
  __syncwarp();
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kLnWarps + warp) * kLnRowsPerWarp;
  for (int64_t row = first; row < std::min<int64_t>(first + kLnRowsPerWarp, rows); ++row) {
    layernorm_backward_row<In, Copy, kVector>(dout + row * channels, x + row * channels, w, mean[row], rstd[row],
                                              channels, dx + row * channels, accumulate,
                                              copy != nullptr ? copy + row * channels : nullptr, round, sw, sb);
  }
  __syncthreads();
  // The block's partial row: its warps' rows in warp order.
  float* partial = ws.partials + static_cast<int64_t>(blockIdx.x) * two_c;
  for (int j = static_cast<int>(threadIdx.x); j < two_c; j += kLnThreads) {
    float s = 0.0f;
    for (int k = 0; k < kLnWarps; ++k) s += warp_rows[k * two_c + j];
    partial[j] = s;
  }
  // The last block adds the partials (the threadFenceReduction pattern).
  __threadfence();
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ws.counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  for (int j = static_cast<int>(threadIdx.x); j < two_c; j += kLnThreads) {
    float s = 0.0f;
    for (unsigned k = 0; k < gridDim.x; ++k) s += __ldcg(ws.partials + static_cast<int64_t>(k) * two_c + j);
    if (j < channels) {
      dw[j] = s;
    } else {
      db[j - channels] = s;
    }
  }
  if (threadIdx.x == 0) *ws.counter = 0u;  // for the next call
}

// ---- launchers -------------------------------------------------------------------

void check_act(const Act& a, const char* what) {
  MP_ENFORCE(a.dtype == DType::kF32 || (a.dtype == DType::kBF16 && a.bf16), what, " stored as ", dtype_name(a.dtype),
             ": need fp32 or bf16");
}

bool vector_rows(int64_t channels, std::initializer_list<const void*> pointers) {
  if (channels % kVec != 0) return false;
  for (const void* p : pointers) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

template <class Out>
void launch_forward(const float* x, const float* w, const float* b, int64_t rows, int64_t channels, const Act& out,
                    float* mean, float* rstd, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((rows + kLnWarps - 1) / kLnWarps);
  auto* o = static_cast<Out*>(out.data);
  const bool round = out.bf16;
  if (vector_rows(channels, {x, w, b, o})) {
    layernorm_forward_kernel<Out, true><<<blocks, kLnThreads, 0, stream>>>(x, w, b, rows, static_cast<int>(channels),
                                                                            o, round, mean, rstd);
  } else {
    layernorm_forward_kernel<Out, false><<<blocks, kLnThreads, 0, stream>>>(x, w, b, rows, static_cast<int>(channels),
                                                                             o, round, mean, rstd);
  }
  MP_CHECK_CUDA(cudaGetLastError());
}

// The kernel instance, with its dynamic shared memory allowed once.
template <class In, class Copy, bool kVector>
auto backward_kernel(int64_t smem_bytes) {
  auto kernel = &layernorm_backward_kernel<In, Copy, kVector>;
  static const bool allowed = [&] {
    MP_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(2 * kLnWarps * kLnMaxChannels * sizeof(float))));
    return true;
  }();
  (void)allowed;
  (void)smem_bytes;
  return kernel;
}

template <class In, class Copy>
void launch_backward(const Act& dout, const float* x, const float* w, const float* mean, const float* rstd,
                     int64_t rows, int64_t channels, float* dx, bool accumulate, const Act& copy, float* dw, float* db,
                     void* workspace, cudaStream_t stream) {
  const auto* g = static_cast<const In*>(dout.data);
  auto* c = static_cast<Copy*>(copy.data);
  const LnWorkspace ws = workspace_of(workspace, rows, channels);
  const int64_t smem = 2 * kLnWarps * channels * static_cast<int64_t>(sizeof(float));
  const auto blocks = static_cast<unsigned>(backward_blocks(rows));
  const auto ch = static_cast<int>(channels);
  if (vector_rows(channels, {g, x, w, dx, c})) {
    backward_kernel<In, Copy, true>(smem)<<<blocks, kLnThreads, static_cast<size_t>(smem), stream>>>(
        g, x, w, mean, rstd, rows, ch, dx, accumulate, c, copy.bf16, dw, db, ws);
  } else {
    backward_kernel<In, Copy, false>(smem)<<<blocks, kLnThreads, static_cast<size_t>(smem), stream>>>(
        g, x, w, mean, rstd, rows, ch, dx, accumulate, c, copy.bf16, dw, db, ws);
  }
  MP_CHECK_CUDA(cudaGetLastError());
}

template <class In>
void launch_backward_in(const Act& dout, const float* x, const float* w, const float* mean, const float* rstd,
                        int64_t rows, int64_t channels, float* dx, bool accumulate, const Act& copy, float* dw,
                        float* db, void* workspace, cudaStream_t stream) {
  if (copy.data != nullptr && copy.dtype == DType::kBF16) {
    launch_backward<In, bf16>(dout, x, w, mean, rstd, rows, channels, dx, accumulate, copy, dw, db, workspace, stream);
  } else {
    launch_backward<In, float>(dout, x, w, mean, rstd, rows, channels, dx, accumulate, copy, dw, db, workspace,
                               stream);
  }
}

}  // namespace

void gpt_layernorm_forward_cuda(const float* x, const float* w, const float* b, int64_t rows, int64_t channels,
                                Act out, float* mean, float* rstd, cudaStream_t stream) {
  MP_ENFORCE(rows >= 0 && channels > 0, "layernorm of ", rows, " rows of ", channels, " channels");
  check_act(out, "layernorm output");
  if (rows == 0) return;
  MP_ENFORCE(x != nullptr && w != nullptr && b != nullptr && out.data != nullptr && mean != nullptr && rstd != nullptr,
             "layernorm forward: a null pointer");
  if (out.dtype == DType::kBF16) {
    launch_forward<bf16>(x, w, b, rows, channels, out, mean, rstd, stream);
  } else {
    launch_forward<float>(x, w, b, rows, channels, out, mean, rstd, stream);
  }
}

int64_t gpt_layernorm_backward_cuda_workspace_bytes(int64_t rows, int64_t channels) {
  const int64_t floats = backward_blocks(rows) * 2 * channels;
  return ((floats + 63) / 64 * 64) * static_cast<int64_t>(sizeof(float)) + 256;
}

void gpt_layernorm_backward_cuda(Act dout, const float* x, const float* w, const float* mean, const float* rstd,
                                 int64_t rows, int64_t channels, float* dx, bool accumulate, Act dx_copy, float* dw,
                                 float* db, void* workspace, cudaStream_t stream) {
  MP_ENFORCE(rows >= 0 && channels > 0 && channels <= kLnMaxChannels, "layernorm backward of ", rows, " rows of ",
             channels, " channels (at most ", kLnMaxChannels, ")");
  check_act(dout, "layernorm output gradient");
  if (dx_copy.data != nullptr) check_act(dx_copy, "layernorm input gradient copy");
  MP_ENFORCE(dout.data != nullptr && x != nullptr && w != nullptr && mean != nullptr && rstd != nullptr &&
                 dx != nullptr && dw != nullptr && db != nullptr && workspace != nullptr,
             "layernorm backward: a null pointer");
  if (rows == 0) {
    MP_CHECK_CUDA(cudaMemsetAsync(dw, 0, static_cast<size_t>(channels) * sizeof(float), stream));
    MP_CHECK_CUDA(cudaMemsetAsync(db, 0, static_cast<size_t>(channels) * sizeof(float), stream));
    return;
  }
  if (dout.dtype == DType::kBF16) {
    launch_backward_in<bf16>(dout, x, w, mean, rstd, rows, channels, dx, accumulate, dx_copy, dw, db, workspace,
                             stream);
  } else {
    launch_backward_in<float>(dout, x, w, mean, rstd, rows, channels, dx, accumulate, dx_copy, dw, db, workspace,
                              stream);
  }
}

}  // namespace mp

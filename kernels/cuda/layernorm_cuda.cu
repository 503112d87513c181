// kernels/cuda/layernorm_cuda.cu: LayerNorm forward and backward (Note
// [LayerNorm kernels] in layernorm_cuda.h): the kernels, then their
// launchers.
#include <algorithm>
#include <initializer_list>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/layernorm_cuda.h"
#include "kernels/cuda/packed.cuh"
#include "kernels/gpt_math.h"

namespace mp {
namespace {

using cuda_packed::from_f32;
using cuda_packed::load128;
using cuda_packed::load128cs;
using cuda_packed::Packed128;
using cuda_packed::store128;
using cuda_packed::to_f32;
using cuda_warp::warp_sum;

constexpr float kEps = static_cast<float>(math::kGptLayerNormEps);
using cuda_launch::kLnSumColumns;
using cuda_launch::kLnSumSlices;
using cuda_launch::kLnThreads;
using cuda_launch::kLnTile;
using cuda_launch::kLnWarps;
constexpr int kVec = cuda_launch::kLnVec;  // elements per lane per 16-byte step (8 bf16, 2 x 4 fp32)

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

// The workspace: the blocks' partial rows [blocks][2 channels] (dw then db),
// then each row's two sums [rows][2] (phase 1's output, phase 2's input).
struct LnWorkspace {
  float* partials;
  float2* row_sums;
};

LnWorkspace workspace_of(void* base, int64_t rows, int64_t channels) {
  auto* partials = static_cast<float*>(base);
  const int64_t floats = cuda_launch::layernorm_backward(rows).grid.x * 2 * channels;
  return LnWorkspace{partials, reinterpret_cast<float2*>(partials + (floats + 63) / 64 * 64)};
}

// Phase 1 of a row: the means of w g and of w g norm (one warp).
template <class In, bool kVector>
__device__ __forceinline__ float2 layernorm_row_sums(const In* g, const float* xr, const float* w, float m, float r,
                                                     int channels) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  float a = 0.0f, c = 0.0f;
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
  const float inv_c = 1.0f / static_cast<float>(channels);
  return make_float2(warp_sum(a) * inv_c, warp_sum(c) * inv_c);
}

// Channel k of this lane's eight in a column tile starting at c0: eight
// consecutive channels (16-byte steps), or a stride of 32 (scalar rows).
template <bool kVector>
__device__ __forceinline__ int tile_channel(int lane, int k) {
  return kVector ? lane * kVec + k : k * 32 + lane;
}

// Phase 2 of a row on this lane's eight channels of a tile: dx (and its
// copy), and the row's dw, db terms added into dw[], db[].
template <class In, class Copy, bool kVector>
__device__ __forceinline__ void layernorm_row_tile(const In* g, const float* xr, const float* w, float m, float r,
                                                   float2 sums, int c0, int channels, float* dxr, bool accumulate,
                                                   Copy* copy, bool round, float* dw, float* db) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if constexpr (kVector) {
    const int j = c0 + lane * kVec;
    if (j >= channels) return;  // channels % 8 == 0: whole packs only
    const F8 gv = load8_as_f32(g + j), xv = load8(xr + j), wv = load8(w + j);
    F8 d = accumulate ? load8(dxr + j) : F8{};
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float v = math::layernorm_dx(xv.v[k], m, r, wv.v[k] * gv.v[k], sums.x, sums.y);
      d.v[k] = accumulate ? d.v[k] + v : v;
      dw[k] += gv.v[k] * ((xv.v[k] - m) * r);
      db[k] += gv.v[k];
    }
    store8(dxr + j, d);
    if (copy != nullptr) store8_from_f32(copy + j, d, round);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int j = c0 + tile_channel<false>(lane, k);
      if (j >= channels) continue;
      const float gj = to_f32(g[j]);
      const float v = math::layernorm_dx(xr[j], m, r, w[j] * gj, sums.x, sums.y);
      const float d = accumulate ? dxr[j] + v : v;
      dxr[j] = d;
      if (copy != nullptr) copy[j] = from_f32<Copy>(d, round);
      dw[k] += gj * ((xr[j] - m) * r);
      db[k] += gj;
    }
  }
}

// A block takes rows_per_block rows. Phase 1: each warp its rows' two sums
// (into the workspace). Phase 2, per column tile of kLnTile channels: each
// warp its rows' dx and their dw, db terms in row order, then the block
// adds its warps' terms in warp order into its partial row. Shared memory
// is the same at any width.
template <class In, class Copy, bool kVector>
__global__ void __launch_bounds__(kLnThreads)
    layernorm_backward_kernel(const In* dout, const float* x, const float* w, const float* mean, const float* rstd,
                              int64_t rows, int64_t rows_per_block, int channels, float* dx, bool accumulate,
                              Copy* copy, bool round, LnWorkspace ws) {
  __shared__ float tiles[kLnWarps][2][kLnTile];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t last = std::min(first + rows_per_block, rows);
  for (int64_t row = first + warp; row < last; row += kLnWarps) {
    const float2 s =
        layernorm_row_sums<In, kVector>(dout + row * channels, x + row * channels, w, mean[row], rstd[row], channels);
    if (lane == 0) ws.row_sums[row] = s;
  }
  __syncthreads();  // the row sums: global memory written by this block
  float* partial = ws.partials + static_cast<int64_t>(blockIdx.x) * 2 * channels;
  for (int c0 = 0; c0 < channels; c0 += kLnTile) {
    float dw[kVec] = {}, db[kVec] = {};
    for (int64_t row = first + warp; row < last; row += kLnWarps) {
      const int64_t at = row * channels;
      layernorm_row_tile<In, Copy, kVector>(dout + at, x + at, w, mean[row], rstd[row], ws.row_sums[row], c0, channels,
                                            dx + at, accumulate, copy != nullptr ? copy + at : nullptr, round, dw, db);
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      tiles[warp][0][tile_channel<kVector>(lane, k)] = dw[k];
      tiles[warp][1][tile_channel<kVector>(lane, k)] = db[k];
    }
    __syncthreads();
    for (int t = static_cast<int>(threadIdx.x); t < 2 * kLnTile; t += kLnThreads) {
      const int which = t / kLnTile, col = t % kLnTile;
      float s = 0.0f;
      for (int k = 0; k < kLnWarps; ++k) s += tiles[k][which][col];
      if (c0 + col < channels) partial[which * channels + c0 + col] = s;
    }
    __syncthreads();  // the tiles are written again for the next columns
  }
}

// dw, db: column c of the partial rows [blocks][2 channels] summed in block
// order; kLnSumSlices slices of the blocks per column, added in slice order.
__global__ void __launch_bounds__(kLnSumColumns* kLnSumSlices)
    layernorm_backward_sum_kernel(const float* partials, int64_t blocks, int channels, float* dw, float* db) {
  __shared__ float slices[kLnSumSlices][kLnSumColumns];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kLnSumColumns + threadIdx.x, two_c = 2 * int64_t{channels};
  const int64_t per = (blocks + kLnSumSlices - 1) / kLnSumSlices;
  const int64_t b0 = threadIdx.y * per, b1 = std::min(blocks, b0 + per);
  float s = 0.0f;
  if (col < two_c) {
    for (int64_t b = b0; b < b1; ++b) s += partials[b * two_c + col];
  }
  slices[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || col >= two_c) return;
  float total = 0.0f;
  for (int k = 0; k < kLnSumSlices; ++k) total += slices[k][threadIdx.x];
  if (col < channels) {
    dw[col] = total;
  } else {
    db[col - channels] = total;
  }
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
  auto* o = static_cast<Out*>(out.data);
  const auto kernel = vector_rows(channels, {x, w, b, o}) ? &layernorm_forward_kernel<Out, true>
                                                          : &layernorm_forward_kernel<Out, false>;
  launch_kernel(kernel, cuda_launch::layernorm_forward(rows), stream, x, w, b, rows, static_cast<int>(channels), o,
                out.bf16, mean, rstd);
}

template <class In, class Copy>
void launch_backward(const Act& dout, const float* x, const float* w, const float* mean, const float* rstd,
                     int64_t rows, int64_t channels, float* dx, bool accumulate, const Act& copy, float* dw, float* db,
                     void* workspace, cudaStream_t stream) {
  const auto* g = static_cast<const In*>(dout.data);
  auto* c = static_cast<Copy*>(copy.data);
  const LnWorkspace ws = workspace_of(workspace, rows, channels);
  const auto kernel = vector_rows(channels, {g, x, w, dx, c}) ? &layernorm_backward_kernel<In, Copy, true>
                                                              : &layernorm_backward_kernel<In, Copy, false>;
  const LaunchConfig config = cuda_launch::layernorm_backward(rows);
  launch_kernel(kernel, config, stream, g, x, w, mean, rstd, rows, cuda_launch::layernorm_backward_rows_per_block(rows),
                static_cast<int>(channels), dx, accumulate, c, copy.bf16, ws);
  launch_kernel(&layernorm_backward_sum_kernel, cuda_launch::layernorm_backward_sum(channels), stream,
                static_cast<const float*>(ws.partials), config.grid.x, static_cast<int>(channels), dw, db);
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
  const int64_t floats = cuda_launch::layernorm_backward(rows).grid.x * 2 * channels;
  return ((floats + 63) / 64 * 64 + 2 * std::max<int64_t>(rows, 1)) * static_cast<int64_t>(sizeof(float));
}

void gpt_layernorm_backward_cuda(Act dout, const float* x, const float* w, const float* mean, const float* rstd,
                                 int64_t rows, int64_t channels, float* dx, bool accumulate, Act dx_copy, float* dw,
                                 float* db, void* workspace, cudaStream_t stream) {
  MP_ENFORCE(rows >= 0 && channels > 0 && channels <= INT32_MAX / 2, "layernorm backward of ", rows, " rows of ",
             channels, " channels");
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

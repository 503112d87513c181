// kernels/cuda/flash_attention.cu: Note [Flash attention kernels] in
// flash_attention_cuda.h. Each kernel is templated on kDims, the columns of
// a head each lane owns (ceil(head_dim / 32)).
#include <cmath>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/cuda/flash_attention_cuda.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace mp {
namespace {

using cuda_launch::kFlashRows;  // warps per block: query rows (forward, dq) or key rows (dk, dv)
using cuda_launch::kWarp;
constexpr int kTile = cuda_launch::kFlashTile;  // keys (or queries) staged per round: one per lane
constexpr unsigned kFull = cuda_warp::kFullMask;

struct Shape {
  int64_t seq, channels, heads;
  int hd;
  float scale;
  __host__ __device__ int64_t row_stride() const { return 3 * channels; }
};

using cuda_warp::warp_max;
using cuda_warp::warp_sum;

// Row `r` of length hd at `a` (shared memory) dotted with row `b`, in column order.
__device__ __forceinline__ float dot(const float* a, const float* b, int hd) {
  float acc = 0.0f;
  for (int d = 0; d < hd; ++d) acc += a[d] * b[d];
  return acc;
}

// Stages rows r0 .. r0 + kTile - 1 (zeros past seq) of the q, k or v third
// `part` of (batch b, head h) into `dst` [kTile][hd + 1]; the whole block.
__device__ void stage_tile(const float* base, const Shape& sh, int64_t r0, int part, float* dst) {
  const int ld = sh.hd + 1;
  for (int idx = threadIdx.x; idx < kTile * sh.hd; idx += blockDim.x) {
    const int r = idx / sh.hd, d = idx % sh.hd;
    const int64_t row = r0 + r;
    dst[r * ld + d] = row < sh.seq ? base[row * sh.row_stride() + part * sh.channels + d] : 0.0f;
  }
}

// Stages this warp's own row (one of q, k, v, or a row of dout/out with
// stride `stride`) into dst [hd].
__device__ void stage_row(const float* src, int hd, float* dst) {
  for (int d = threadIdx.x % kWarp; d < hd; d += kWarp) dst[d] = src[d];
}

template <int kDims>
__global__ void flash_forward_kernel(const float* qkv, Shape sh, float* out, float* lse) {
  extern __shared__ float smem[];
  const int hd = sh.hd, ld = hd + 1;
  float* ks = smem;
  float* vs = ks + kTile * ld;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  float* qs = vs + kTile * ld + warp * hd;
  const int64_t bh = blockIdx.y, b = bh / sh.heads, h = bh % sh.heads;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kFlashRows, t = t0 + warp;
  const float* base = qkv + b * sh.seq * sh.row_stride() + h * hd;
  if (t < sh.seq) stage_row(base + t * sh.row_stride(), hd, qs);
  float m = -INFINITY, l = 0.0f, o[kDims] = {};
  const int64_t last = min(t0 + kFlashRows, sh.seq) - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and q is staged)
    stage_tile(base, sh, j0, 1, ks);
    stage_tile(base, sh, j0, 2, vs);
    __syncthreads();
    if (t >= sh.seq || j0 > t) continue;  // warp-uniform
    const int64_t key = j0 + lane;
    const float s = key <= t ? dot(qs, ks + lane * ld, hd) * sh.scale : -INFINITY;
    const float m_new = fmaxf(m, warp_max(s));  // finite: key j0 <= t
    const float corr = expf(m - m_new);        // 0 on the first tile
    const float p = key <= t ? expf(s - m_new) : 0.0f;
    l = l * corr + warp_sum(p);
    const int n = static_cast<int>(min(static_cast<int64_t>(kTile), t - j0 + 1));
#pragma unroll
    for (int i = 0; i < kDims; ++i) o[i] *= corr;
    for (int j = 0; j < n; ++j) {
      const float pj = __shfl_sync(kFull, p, j);
#pragma unroll
      for (int i = 0; i < kDims; ++i) {
        const int d = lane + i * kWarp;
        if (d < hd) o[i] += pj * vs[j * ld + d];
      }
    }
    m = m_new;
  }
  if (t >= sh.seq) return;
  const float inv = 1.0f / l;
  float* y = out + (b * sh.seq + t) * sh.channels + h * hd;
#pragma unroll
  for (int i = 0; i < kDims; ++i) {
    const int d = lane + i * kWarp;
    if (d < hd) y[d] = o[i] * inv;
  }
  if (lane == 0) lse[bh * sh.seq + t] = m + logf(l);
}

// delta[bh, t] = dout[t] . out[t] over head h's columns; one warp per (row, head).
__global__ void flash_delta_kernel(const float* out, const float* dout, Shape sh, int64_t rows, float* delta) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (w >= rows * sh.heads) return;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t row = w / sh.heads, h = w % sh.heads, b = row / sh.seq, t = row % sh.seq;
  const float* o = out + row * sh.channels + h * sh.hd;
  const float* g = dout + row * sh.channels + h * sh.hd;
  float acc = 0.0f;
  for (int d = lane; d < sh.hd; d += kWarp) acc += o[d] * g[d];
  acc = warp_sum(acc);
  if (lane == 0) delta[(b * sh.heads + h) * sh.seq + t] = acc;
}

template <int kDims>
__global__ void flash_dq_kernel(const float* qkv, const float* lse, const float* delta, const float* dout, Shape sh,
                                float* dqkv) {
  extern __shared__ float smem[];
  const int hd = sh.hd, ld = hd + 1;
  float* ks = smem;
  float* vs = ks + kTile * ld;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  float* qs = vs + kTile * ld + warp * 2 * hd;
  float* gs = qs + hd;  // this row's dout
  const int64_t bh = blockIdx.y, b = bh / sh.heads, h = bh % sh.heads;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kFlashRows, t = t0 + warp;
  const float* base = qkv + b * sh.seq * sh.row_stride() + h * hd;
  float row_lse = 0.0f, row_delta = 0.0f;
  if (t < sh.seq) {
    stage_row(base + t * sh.row_stride(), hd, qs);
    stage_row(dout + (b * sh.seq + t) * sh.channels + h * hd, hd, gs);
    row_lse = lse[bh * sh.seq + t];
    row_delta = delta[bh * sh.seq + t];
  }
  float dq[kDims] = {};
  const int64_t last = min(t0 + kFlashRows, sh.seq) - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();
    stage_tile(base, sh, j0, 1, ks);
    stage_tile(base, sh, j0, 2, vs);
    __syncthreads();
    if (t >= sh.seq || j0 > t) continue;
    const int64_t key = j0 + lane;
    float ds = 0.0f;
    if (key <= t) {
      const float p = expf(dot(qs, ks + lane * ld, hd) * sh.scale - row_lse);
      ds = p * (dot(gs, vs + lane * ld, hd) - row_delta);
    }
    const int n = static_cast<int>(min(static_cast<int64_t>(kTile), t - j0 + 1));
    for (int j = 0; j < n; ++j) {
      const float dsj = __shfl_sync(kFull, ds, j);
#pragma unroll
      for (int i = 0; i < kDims; ++i) {
        const int d = lane + i * kWarp;
        if (d < hd) dq[i] += dsj * ks[j * ld + d];
      }
    }
  }
  if (t >= sh.seq) return;
  float* dst = dqkv + (b * sh.seq + t) * sh.row_stride() + h * hd;
#pragma unroll
  for (int i = 0; i < kDims; ++i) {
    const int d = lane + i * kWarp;
    if (d < hd) dst[d] = dq[i] * sh.scale;
  }
}

template <int kDims>
__global__ void flash_dkv_kernel(const float* qkv, const float* lse, const float* delta, const float* dout, Shape sh,
                                 float* dqkv) {
  extern __shared__ float smem[];
  const int hd = sh.hd, ld = hd + 1;
  float* qs = smem;             // query tile [kTile][ld]
  float* gs = qs + kTile * ld;  // its dout rows
  float* lses = gs + kTile * ld;
  float* deltas = lses + kTile;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  float* kr = deltas + kTile + warp * 2 * hd;  // this warp's key row
  float* vr = kr + hd;                         // and value row
  const int64_t bh = blockIdx.y, b = bh / sh.heads, h = bh % sh.heads;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kFlashRows, j = j0 + warp;
  const float* base = qkv + b * sh.seq * sh.row_stride() + h * hd;
  if (j < sh.seq) {
    stage_row(base + j * sh.row_stride() + sh.channels, hd, kr);
    stage_row(base + j * sh.row_stride() + 2 * sh.channels, hd, vr);
  }
  float dk[kDims] = {}, dv[kDims] = {};
  for (int64_t i0 = j0 / kTile * kTile; i0 < sh.seq; i0 += kTile) {
    __syncthreads();
    stage_tile(base, sh, i0, 0, qs);
    for (int idx = threadIdx.x; idx < kTile * hd; idx += blockDim.x) {
      const int r = idx / hd, d = idx % hd;
      const int64_t row = i0 + r;
      gs[r * ld + d] = row < sh.seq ? dout[(b * sh.seq + row) * sh.channels + h * hd + d] : 0.0f;
    }
    for (int r = static_cast<int>(threadIdx.x); r < kTile; r += blockDim.x) {
      const int64_t row = i0 + r;
      lses[r] = row < sh.seq ? lse[bh * sh.seq + row] : 0.0f;
      deltas[r] = row < sh.seq ? delta[bh * sh.seq + row] : 0.0f;
    }
    __syncthreads();
    if (j >= sh.seq || i0 + kTile - 1 < j) continue;  // warp-uniform
    const int64_t query = i0 + lane;
    float p = 0.0f, ds = 0.0f;
    if (query >= j && query < sh.seq) {
      p = expf(dot(qs + lane * ld, kr, hd) * sh.scale - lses[lane]);
      ds = p * (dot(gs + lane * ld, vr, hd) - deltas[lane]);
    }
    for (int q = 0; q < kTile; ++q) {
      const float pq = __shfl_sync(kFull, p, q), dsq = __shfl_sync(kFull, ds, q);
#pragma unroll
      for (int i = 0; i < kDims; ++i) {
        const int d = lane + i * kWarp;
        if (d < hd) {
          dv[i] += pq * gs[q * ld + d];
          dk[i] += dsq * qs[q * ld + d];
        }
      }
    }
  }
  if (j >= sh.seq) return;
  float* dst = dqkv + (b * sh.seq + j) * sh.row_stride() + h * hd;
#pragma unroll
  for (int i = 0; i < kDims; ++i) {
    const int d = lane + i * kWarp;
    if (d < hd) {
      dst[sh.channels + d] = dk[i] * sh.scale;
      dst[2 * sh.channels + d] = dv[i];
    }
  }
}

Shape flash_shape(int64_t batch, int64_t seq, int64_t channels, int64_t heads) {
  MP_ENFORCE(batch >= 0 && seq >= 0, "attention of batch ", batch, " x seq ", seq);
  MP_ENFORCE(heads > 0 && channels > 0 && channels % heads == 0, heads, " heads do not divide ", channels,
             " channels");
  const int64_t hd = channels / heads;
  MP_ENFORCE(hd <= kFlashMaxHeadDim, "flash attention takes head sizes up to ", kFlashMaxHeadDim, ", got ", hd);
  MP_ENFORCE(batch * heads <= 65535, "flash attention grid of ", batch * heads, " (batch x heads) blocks in y");
  return Shape{seq, channels, heads, static_cast<int>(hd), 1.0f / sqrtf(static_cast<float>(hd))};
}

// kernel<kDims> for kDims = ceil(hd / 32).
template <template <int> class Launch, class... Args>
void dispatch_dims(int hd, Args&&... args) {
  switch ((hd + kWarp - 1) / kWarp) {
    case 1: Launch<1>::run(args...); break;
    case 2: Launch<2>::run(args...); break;
    case 3: Launch<3>::run(args...); break;
    default: Launch<4>::run(args...); break;
  }
}

template <int kDims>
struct LaunchForward {
  static void run(const float* qkv, const Shape& sh, int64_t batch, float* out, float* lse, cudaStream_t stream) {
    launch_kernel(&flash_forward_kernel<kDims>, cuda_launch::flash_forward(batch, sh.seq, sh.heads, sh.hd), stream, qkv,
                  sh, out, lse);
  }
};

template <int kDims>
struct LaunchBackward {
  static void run(const float* qkv, const float* lse, const float* delta, const float* dout, const Shape& sh,
                  int64_t batch, float* dqkv, cudaStream_t stream) {
    launch_kernel(&flash_dq_kernel<kDims>, cuda_launch::flash_dq(batch, sh.seq, sh.heads, sh.hd), stream, qkv, lse,
                  delta, dout, sh, dqkv);
    launch_kernel(&flash_dkv_kernel<kDims>, cuda_launch::flash_dkv(batch, sh.seq, sh.heads, sh.hd), stream, qkv, lse,
                  delta, dout, sh, dqkv);
  }
};

}  // namespace

void flash_attention_forward_cuda(const float* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads,
                                  float* out, float* lse, cudaStream_t stream) {
  const Shape sh = flash_shape(batch, seq, channels, heads);
  if (batch * seq == 0) return;
  MP_ENFORCE(qkv && out && lse, "flash attention forward of null memory");
  dispatch_dims<LaunchForward>(sh.hd, qkv, sh, batch, out, lse, stream);
}

int64_t flash_attention_backward_scratch_elements(int64_t batch, int64_t seq, int64_t heads) {
  return batch * heads * seq;
}

void flash_attention_backward_cuda(const float* qkv, const float* out, const float* lse, const float* dout,
                                   int64_t batch, int64_t seq, int64_t channels, int64_t heads, float* scratch,
                                   float* dqkv, cudaStream_t stream) {
  const Shape sh = flash_shape(batch, seq, channels, heads);
  const int64_t rows = batch * seq;
  if (rows == 0) return;
  MP_ENFORCE(qkv && out && lse && dout && scratch && dqkv, "flash attention backward of null memory");
  // First delta [batch, heads, seq] := dout . out over each head's columns, into scratch.
  launch_kernel(&flash_delta_kernel, cuda_launch::flash_delta(rows, heads), stream, out, dout, sh, rows,
                static_cast<float*>(scratch));
  dispatch_dims<LaunchBackward>(sh.hd, qkv, lse, static_cast<const float*>(scratch), dout, sh, batch, dqkv, stream);
}

}  // namespace mp

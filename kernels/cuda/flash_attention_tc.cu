// kernels/cuda/flash_attention_tc.cu: the tensor-core flash attention of
// Note [Flash attention kernels] (flash_attention_cuda.h): q, k, v, the
// probabilities and the score gradients rounded to bf16, every product on
// tensor cores (WMMA 16x16x16, bf16 in, fp32 accumulation), head sizes 64
// and 128.
//
// Layout of the work (FlashAttention-2's): a block is 4 warps over 64 rows
// (queries in the forward and dq kernels, keys in the dk/dv kernel), 16
// rows a warp; the other side walks in tiles of 64 staged in shared memory
// as bf16. Score tiles go through shared memory in fp32 so each lane can
// mask, exponentiate and rescale them (WMMA fragments are opaque); the
// forward keeps its output accumulator in shared memory (it is rescaled each
// tile), the backward keeps dq, dk, dv in fragments (they only add up).
// Every sum runs in a fixed order; there are no atomics.
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/cuda/flash_attention_cuda.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace mp {
namespace {

using namespace nvcuda;  // NOLINT: wmma::

constexpr int kWarp = 32;
constexpr int kRows = 64;   // rows of a block
constexpr int kWarps = 4;   // 16 rows each
constexpr int kTile = 64;   // keys (forward, dq) or queries (dk, dv) per tile
constexpr int kFrag = 16;   // WMMA tile edge

using bf16x = __nv_bfloat16;
using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16x, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16x, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16x, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

struct Shape {
  int64_t seq, channels, heads;
  float scale;
  __host__ __device__ int64_t row_stride() const { return 3 * channels; }
};

// Row strides (elements) of the shared-memory tiles, padded against bank
// conflicts; every 16-row block and 16-column step stays 32-byte aligned,
// as WMMA loads need.
template <int HD>
struct Ld {
  static constexpr int h = HD + 8;      // bf16 q, k, v, dout tiles
  static constexpr int s = kTile + 4;   // fp32 score tiles
  static constexpr int p = kTile + 8;   // bf16 probability / score-gradient tiles
  static constexpr int o = HD + 4;      // fp32 output accumulator
};

constexpr size_t align128(size_t b) { return (b + 127) / 128 * 128; }

// Carves the dynamic shared memory in 128-byte aligned pieces. With a null
// base (on the host) it only counts: each kernel's layout below is one
// struct, whose byte count sizes the launch and whose pointers the kernel
// uses, so the two cannot disagree.
struct SmemCarver {
  unsigned char* base;
  size_t used = 0;
  template <class T>
  __host__ __device__ T* take(size_t n) {
    T* p = base == nullptr ? nullptr : reinterpret_cast<T*>(base + used);
    used += align128(n * sizeof(T));
    return p;
  }
};

// Where a block's warp works: its lane, its first row in the block, the
// (batch, head) of the block and that head's columns of row 0 of qkv.
struct Place {
  int warp, lane, w0;
  int64_t bh, b, h, row0;
  const float* base;
};

template <int HD>
__device__ Place place(const float* qkv, const Shape& sh) {
  Place p;
  p.warp = static_cast<int>(threadIdx.x) / kWarp;
  p.lane = static_cast<int>(threadIdx.x) % kWarp;
  p.w0 = p.warp * kFrag;
  p.bh = blockIdx.y;
  p.b = p.bh / sh.heads;
  p.h = p.bh % sh.heads;
  p.row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  p.base = qkv + p.b * sh.seq * sh.row_stride() + p.h * HD;
  return p;
}

using cuda_warp::warp_max;
using cuda_warp::warp_sum;

// Rows r0 .. r0 + 63 of `src` (row stride `stride`, the head's HD columns
// at `src`), as bf16 into dst [64][Ld::h]; zeros past `rows`. Whole block.
template <int HD>
__device__ void stage(const float* src, int64_t stride, int64_t r0, int64_t rows, bf16x* dst) {
  for (int idx = threadIdx.x; idx < kRows * HD; idx += blockDim.x) {
    const int r = idx / HD, d = idx % HD;
    const int64_t row = r0 + r;
    dst[r * Ld<HD>::h + d] = __float2bfloat16_rn(row < rows ? src[row * stride + d] : 0.0f);
  }
}

// acc (16 x 16) := rows [16 w, 16 w + 16) of A (row-major, lda) times the
// 16-column block n of B^T, B row-major [n-rows][k] (lda): A B^T.
template <int K>
__device__ void mma_abt(FragC& acc, const bf16x* a, int lda, const bf16x* b, int ldb) {
  wmma::fill_fragment(acc, 0.0f);
  for (int k = 0; k < K; k += kFrag) {
    FragA fa;
    FragBCol fb;
    wmma::load_matrix_sync(fa, a + k, lda);
    wmma::load_matrix_sync(fb, b + k, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// acc += A (16 x K, row-major, lda) times B (K x 16, row-major, ldb).
template <int K>
__device__ void mma_ab(FragC& acc, const bf16x* a, int lda, const bf16x* b, int ldb) {
  for (int k = 0; k < K; k += kFrag) {
    FragA fa;
    FragBRow fb;
    wmma::load_matrix_sync(fa, a + k, lda);
    wmma::load_matrix_sync(fb, b + static_cast<size_t>(k) * ldb, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// The forward's shared memory: q, a tile of k and v (bf16), the scores,
// probabilities and output accumulator of the block's rows, a 16 x 16
// scratch per warp, and each row's running max, sum and last rescaling.
template <int HD>
struct ForwardSmem {
  bf16x *qs, *ks, *vs, *p;
  float *s, *o, *scratch, *m, *l, *corr;
  size_t bytes;
  __host__ __device__ explicit ForwardSmem(unsigned char* base) {
    using L = Ld<HD>;
    SmemCarver k{base};
    qs = k.take<bf16x>(kRows * L::h);
    ks = k.take<bf16x>(kRows * L::h);
    vs = k.take<bf16x>(kRows * L::h);
    s = k.take<float>(kRows * L::s);
    p = k.take<bf16x>(kRows * L::p);
    o = k.take<float>(kRows * L::o);
    scratch = k.take<float>(kWarps * kFrag * kFrag);
    m = k.take<float>(kRows);
    l = k.take<float>(kRows);
    corr = k.take<float>(kRows);
    bytes = k.used;
  }
};

template <int HD>
__global__ void __launch_bounds__(kWarps * kWarp) tc_forward_kernel(const float* qkv, Shape sh, float* out,
                                                                    float* lse) {
  using L = Ld<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  const ForwardSmem<HD> sm(smem);
  bf16x *qs = sm.qs, *ks = sm.ks, *vs = sm.vs, *p = sm.p;
  float *s = sm.s, *o = sm.o, *m = sm.m, *l = sm.l, *corr = sm.corr;
  const Place at = place<HD>(qkv, sh);
  const int lane = at.lane, w0 = at.w0;
  const int64_t bh = at.bh, b = at.b, h = at.h, q0 = at.row0;
  const float* base = at.base;
  float* scratch = sm.scratch + at.warp * kFrag * kFrag;
  stage<HD>(base, sh.row_stride(), q0, sh.seq, qs);
  for (int idx = threadIdx.x; idx < kRows * L::o; idx += blockDim.x) o[idx] = 0.0f;
  for (int r = threadIdx.x; r < kRows; r += blockDim.x) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  const int64_t last = min(q0 + kRows, sh.seq) - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and q, o, m, l are ready)
    stage<HD>(base + sh.channels, sh.row_stride(), j0, sh.seq, ks);
    stage<HD>(base + 2 * sh.channels, sh.row_stride(), j0, sh.seq, vs);
    __syncthreads();
    if (q0 + w0 + kFrag - 1 < j0) continue;  // warp-uniform: every key of the tile is after this warp's rows
#pragma unroll
    for (int n = 0; n < kTile / kFrag; ++n) {  // s = q k^T
      FragC acc;
      mma_abt<HD>(acc, qs + w0 * L::h, L::h, ks + n * kFrag * L::h, L::h);
      wmma::store_matrix_sync(s + w0 * L::s + n * kFrag, acc, L::s, wmma::mem_row_major);
    }
    __syncwarp();
    for (int r = 0; r < kFrag; ++r) {  // online softmax, one row at a time
      const int row = w0 + r;
      const int64_t t = q0 + row;
      float sc[2], pr[2];
      for (int i = 0; i < 2; ++i) {
        const int64_t key = j0 + lane + i * kWarp;
        sc[i] = t < sh.seq && key <= t ? s[row * L::s + lane + i * kWarp] * sh.scale : -INFINITY;
      }
      const float m_old = m[row];
      const float m_new = fmaxf(m_old, warp_max(fmaxf(sc[0], sc[1])));
      float c = 1.0f;
      if (m_new == -INFINITY) {  // a padding row (t >= seq): nothing to add
        pr[0] = pr[1] = 0.0f;
      } else {
        c = expf(m_old - m_new);  // 0 on the first tile
        for (int i = 0; i < 2; ++i) pr[i] = expf(sc[i] - m_new);
      }
      const float sum = warp_sum(pr[0] + pr[1]);
      for (int i = 0; i < 2; ++i) p[row * L::p + lane + i * kWarp] = __float2bfloat16_rn(pr[i]);
      if (lane == 0) {
        l[row] = l[row] * c + sum;
        m[row] = m_new;
        corr[row] = c;
      }
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < HD / kFrag; ++n) {  // o = o corr + p v
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      mma_ab<kTile>(acc, p + w0 * L::p, L::p, vs + n * kFrag, L::h);
      wmma::store_matrix_sync(scratch, acc, kFrag, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < kFrag * kFrag; e += kWarp) {
        const int row = w0 + e / kFrag, col = n * kFrag + e % kFrag;
        o[row * L::o + col] = o[row * L::o + col] * corr[row] + scratch[e];
      }
      __syncwarp();
    }
  }
  __syncwarp();
  for (int r = 0; r < kFrag; ++r) {
    const int row = w0 + r;
    const int64_t t = q0 + row;
    if (t >= sh.seq) break;
    const float inv = 1.0f / l[row];
    float* y = out + (b * sh.seq + t) * sh.channels + h * HD;
    for (int d = lane; d < HD; d += kWarp) y[d] = o[row * L::o + d] * inv;
    if (lane == 0) lse[bh * sh.seq + t] = m[row] + logf(l[row]);
  }
}

// dq's shared memory: q and dout of the block's queries, a tile of k and v
// (bf16), the scores and their d (fp32), the score gradients (bf16), a
// scratch per warp, and the rows' lse and delta.
template <int HD>
struct DqSmem {
  bf16x *qs, *gs, *ks, *vs, *ds;
  float *s, *dp, *scratch, *lse, *delta;
  size_t bytes;
  __host__ __device__ explicit DqSmem(unsigned char* base) {
    using L = Ld<HD>;
    SmemCarver k{base};
    qs = k.take<bf16x>(kRows * L::h);
    gs = k.take<bf16x>(kRows * L::h);
    ks = k.take<bf16x>(kRows * L::h);
    vs = k.take<bf16x>(kRows * L::h);
    s = k.take<float>(kRows * L::s);
    dp = k.take<float>(kRows * L::s);
    ds = k.take<bf16x>(kRows * L::p);
    scratch = k.take<float>(kWarps * kFrag * kFrag);
    lse = k.take<float>(kRows);
    delta = k.take<float>(kRows);
    bytes = k.used;
  }
};

template <int HD>
__global__ void __launch_bounds__(kWarps * kWarp)
    tc_dq_kernel(const float* qkv, const float* lse, const float* delta, const float* dout, Shape sh, float* dqkv) {
  using L = Ld<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  const DqSmem<HD> sm(smem);
  bf16x *qs = sm.qs, *gs = sm.gs, *ks = sm.ks, *vs = sm.vs, *ds = sm.ds;
  float *s = sm.s, *dp = sm.dp, *lse_s = sm.lse, *delta_s = sm.delta;
  const Place at = place<HD>(qkv, sh);
  const int lane = at.lane, w0 = at.w0;
  const int64_t bh = at.bh, b = at.b, h = at.h, q0 = at.row0;
  const float* base = at.base;
  float* scratch = sm.scratch + at.warp * kFrag * kFrag;
  stage<HD>(base, sh.row_stride(), q0, sh.seq, qs);
  stage<HD>(dout + b * sh.seq * sh.channels + h * HD, sh.channels, q0, sh.seq, gs);
  for (int r = threadIdx.x; r < kRows; r += blockDim.x) {
    const int64_t t = q0 + r;
    lse_s[r] = t < sh.seq ? lse[bh * sh.seq + t] : 0.0f;
    delta_s[r] = t < sh.seq ? delta[bh * sh.seq + t] : 0.0f;
  }
  FragC dq[HD / kFrag];
#pragma unroll
  for (int n = 0; n < HD / kFrag; ++n) wmma::fill_fragment(dq[n], 0.0f);
  const int64_t last = min(q0 + kRows, sh.seq) - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();
    stage<HD>(base + sh.channels, sh.row_stride(), j0, sh.seq, ks);
    stage<HD>(base + 2 * sh.channels, sh.row_stride(), j0, sh.seq, vs);
    __syncthreads();
    if (q0 + w0 + kFrag - 1 < j0) continue;
#pragma unroll
    for (int n = 0; n < kTile / kFrag; ++n) {
      FragC acc;
      mma_abt<HD>(acc, qs + w0 * L::h, L::h, ks + n * kFrag * L::h, L::h);  // q k^T
      wmma::store_matrix_sync(s + w0 * L::s + n * kFrag, acc, L::s, wmma::mem_row_major);
      mma_abt<HD>(acc, gs + w0 * L::h, L::h, vs + n * kFrag * L::h, L::h);  // dout v^T
      wmma::store_matrix_sync(dp + w0 * L::s + n * kFrag, acc, L::s, wmma::mem_row_major);
    }
    __syncwarp();
    for (int r = 0; r < kFrag; ++r) {
      const int row = w0 + r;
      const int64_t t = q0 + row;
      for (int i = 0; i < 2; ++i) {
        const int c = lane + i * kWarp;
        const int64_t key = j0 + c;
        float g = 0.0f;
        if (t < sh.seq && key <= t) {
          const float pr = expf(s[row * L::s + c] * sh.scale - lse_s[row]);
          g = pr * (dp[row * L::s + c] - delta_s[row]);
        }
        ds[row * L::p + c] = __float2bfloat16_rn(g);
      }
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < HD / kFrag; ++n) mma_ab<kTile>(dq[n], ds + w0 * L::p, L::p, ks + n * kFrag, L::h);
  }
#pragma unroll
  for (int n = 0; n < HD / kFrag; ++n) {
    wmma::store_matrix_sync(scratch, dq[n], kFrag, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < kFrag * kFrag; e += kWarp) {
      const int64_t t = q0 + w0 + e / kFrag;
      if (t < sh.seq) dqkv[(b * sh.seq + t) * sh.row_stride() + h * HD + n * kFrag + e % kFrag] = scratch[e] * sh.scale;
    }
    __syncwarp();
  }
}

// dk and dv's shared memory: k and v of the block's keys, a tile of q and
// its dout (bf16), the transposed scores and their d (fp32), the
// transposed probabilities and score gradients (bf16), a scratch per warp,
// and the tile's lse and delta.
template <int HD>
struct DkvSmem {
  bf16x *ks, *vs, *qs, *gs, *pt, *dst;
  float *st, *dpt, *scratch, *lse, *delta;
  size_t bytes;
  __host__ __device__ explicit DkvSmem(unsigned char* base) {
    using L = Ld<HD>;
    SmemCarver k{base};
    ks = k.take<bf16x>(kRows * L::h);
    vs = k.take<bf16x>(kRows * L::h);
    qs = k.take<bf16x>(kTile * L::h);
    gs = k.take<bf16x>(kTile * L::h);
    st = k.take<float>(kRows * L::s);
    dpt = k.take<float>(kRows * L::s);
    pt = k.take<bf16x>(kRows * L::p);
    dst = k.take<bf16x>(kRows * L::p);
    scratch = k.take<float>(kWarps * kFrag * kFrag);
    lse = k.take<float>(kTile);
    delta = k.take<float>(kTile);
    bytes = k.used;
  }
};

template <int HD>
__global__ void __launch_bounds__(kWarps * kWarp)
    tc_dkv_kernel(const float* qkv, const float* lse, const float* delta, const float* dout, Shape sh, float* dqkv) {
  using L = Ld<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  const DkvSmem<HD> sm(smem);
  bf16x *ks = sm.ks, *vs = sm.vs, *qs = sm.qs, *gs = sm.gs, *pt = sm.pt, *dst = sm.dst;
  float *st = sm.st, *dpt = sm.dpt, *lse_s = sm.lse, *delta_s = sm.delta;
  const Place at = place<HD>(qkv, sh);
  const int lane = at.lane, w0 = at.w0;
  const int64_t bh = at.bh, b = at.b, h = at.h, k0 = at.row0;
  const float* base = at.base;
  float* scratch = sm.scratch + at.warp * kFrag * kFrag;
  stage<HD>(base + sh.channels, sh.row_stride(), k0, sh.seq, ks);
  stage<HD>(base + 2 * sh.channels, sh.row_stride(), k0, sh.seq, vs);
  FragC dk[HD / kFrag], dv[HD / kFrag];
#pragma unroll
  for (int n = 0; n < HD / kFrag; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int64_t i0 = k0; i0 < sh.seq; i0 += kTile) {  // queries before k0 see none of these keys
    __syncthreads();
    stage<HD>(base, sh.row_stride(), i0, sh.seq, qs);
    stage<HD>(dout + b * sh.seq * sh.channels + h * HD, sh.channels, i0, sh.seq, gs);
    for (int c = threadIdx.x; c < kTile; c += blockDim.x) {
      const int64_t i = i0 + c;
      lse_s[c] = i < sh.seq ? lse[bh * sh.seq + i] : 0.0f;
      delta_s[c] = i < sh.seq ? delta[bh * sh.seq + i] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < kTile / kFrag; ++n) {
      FragC acc;
      mma_abt<HD>(acc, ks + w0 * L::h, L::h, qs + n * kFrag * L::h, L::h);  // k q^T
      wmma::store_matrix_sync(st + w0 * L::s + n * kFrag, acc, L::s, wmma::mem_row_major);
      mma_abt<HD>(acc, vs + w0 * L::h, L::h, gs + n * kFrag * L::h, L::h);  // v dout^T
      wmma::store_matrix_sync(dpt + w0 * L::s + n * kFrag, acc, L::s, wmma::mem_row_major);
    }
    __syncwarp();
    for (int r = 0; r < kFrag; ++r) {
      const int row = w0 + r;
      const int64_t j = k0 + row;
      for (int x = 0; x < 2; ++x) {
        const int c = lane + x * kWarp;
        const int64_t i = i0 + c;
        float pr = 0.0f, g = 0.0f;
        if (j < sh.seq && i < sh.seq && i >= j) {
          pr = expf(st[row * L::s + c] * sh.scale - lse_s[c]);
          g = pr * (dpt[row * L::s + c] - delta_s[c]);
        }
        pt[row * L::p + c] = __float2bfloat16_rn(pr);
        dst[row * L::p + c] = __float2bfloat16_rn(g);
      }
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < HD / kFrag; ++n) {
      mma_ab<kTile>(dv[n], pt + w0 * L::p, L::p, gs + n * kFrag, L::h);   // p^T dout
      mma_ab<kTile>(dk[n], dst + w0 * L::p, L::p, qs + n * kFrag, L::h);  // ds^T q
    }
  }
#pragma unroll
  for (int n = 0; n < HD / kFrag; ++n) {
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      wmma::store_matrix_sync(scratch, which == 0 ? dk[n] : dv[n], kFrag, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < kFrag * kFrag; e += kWarp) {
        const int64_t j = k0 + w0 + e / kFrag;
        if (j >= sh.seq) continue;
        float* dst_row = dqkv + (b * sh.seq + j) * sh.row_stride() + (which + 1) * sh.channels + h * HD;
        dst_row[n * kFrag + e % kFrag] = which == 0 ? scratch[e] * sh.scale : scratch[e];
      }
      __syncwarp();
    }
  }
}

Shape tc_shape(int64_t batch, int64_t seq, int64_t channels, int64_t heads) {
  MP_ENFORCE(batch >= 0 && seq >= 0, "attention of batch ", batch, " x seq ", seq);
  MP_ENFORCE(heads > 0 && channels > 0 && channels % heads == 0, heads, " heads do not divide ", channels,
             " channels");
  const int64_t hd = channels / heads;
  MP_ENFORCE(flash_attention_tc_supported(hd), "tensor-core flash attention takes head sizes 64 and 128, got ", hd);
  MP_ENFORCE(batch * heads <= 65535, "flash attention grid of ", batch * heads, " (batch x heads) blocks in y");
  return Shape{seq, channels, heads, 1.0f / sqrtf(static_cast<float>(hd))};
}

dim3 tc_grid(int64_t batch, int64_t seq, int64_t heads) {
  return dim3(static_cast<unsigned>((seq + kRows - 1) / kRows), static_cast<unsigned>(batch * heads));
}

// Raises the kernel's dynamic shared-memory limit (above the default 48 KiB).
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  MP_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <int HD>
void forward(const float* qkv, const Shape& sh, dim3 grid, float* out, float* lse, cudaStream_t stream) {
  const size_t smem = ForwardSmem<HD>(nullptr).bytes;
  allow_smem(tc_forward_kernel<HD>, smem);
  tc_forward_kernel<HD><<<grid, kWarps * kWarp, smem, stream>>>(qkv, sh, out, lse);
  MP_CHECK_CUDA(cudaGetLastError());
}

template <int HD>
void backward(const float* qkv, const float* lse, const float* delta, const float* dout, const Shape& sh, dim3 grid,
              float* dqkv, cudaStream_t stream) {
  const size_t dq_smem = DqSmem<HD>(nullptr).bytes;
  allow_smem(tc_dq_kernel<HD>, dq_smem);
  tc_dq_kernel<HD><<<grid, kWarps * kWarp, dq_smem, stream>>>(qkv, lse, delta, dout, sh, dqkv);
  MP_CHECK_CUDA(cudaGetLastError());
  const size_t dkv_smem = DkvSmem<HD>(nullptr).bytes;
  allow_smem(tc_dkv_kernel<HD>, dkv_smem);
  tc_dkv_kernel<HD><<<grid, kWarps * kWarp, dkv_smem, stream>>>(qkv, lse, delta, dout, sh, dqkv);
  MP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace

bool flash_attention_tc_supported(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

void flash_attention_tc_forward_cuda(const float* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads,
                                     float* out, float* lse, cudaStream_t stream) {
  const Shape sh = tc_shape(batch, seq, channels, heads);
  if (batch * seq == 0) return;
  MP_ENFORCE(qkv && out && lse, "flash attention forward of null memory");
  const dim3 grid = tc_grid(batch, seq, heads);
  if (channels / heads == 64) {
    forward<64>(qkv, sh, grid, out, lse, stream);
  } else {
    forward<128>(qkv, sh, grid, out, lse, stream);
  }
}

void flash_attention_tc_backward_cuda(const float* qkv, const float* out, const float* lse, const float* dout,
                                      int64_t batch, int64_t seq, int64_t channels, int64_t heads, float* scratch,
                                      float* dqkv, cudaStream_t stream) {
  const Shape sh = tc_shape(batch, seq, channels, heads);
  if (batch * seq == 0) return;
  MP_ENFORCE(qkv && out && lse && dout && scratch && dqkv, "flash attention backward of null memory");
  flash_attention_delta_cuda(out, dout, batch, seq, channels, heads, scratch, stream);
  const dim3 grid = tc_grid(batch, seq, heads);
  if (channels / heads == 64) {
    backward<64>(qkv, lse, scratch, dout, sh, grid, dqkv, stream);
  } else {
    backward<128>(qkv, lse, scratch, dout, sh, grid, dqkv, stream);
  }
}

}  // namespace mp

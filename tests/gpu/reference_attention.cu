// tests/gpu/reference_attention.cu: the probability-keeping causal attention
// (tests/gpu/reference_attention.h), the flash kernels' reference. Its block
// reductions are the classifier's (kernels/cuda/packed.cuh).
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/packed.cuh"
#include "tests/gpu/gpu_shapes.h"
#include "tests/gpu/reference_attention.h"

namespace mp {
namespace {

using cuda_packed::block_max;
using cuda_packed::block_sum;

// Block p * seq + t is query row t of (batch, head) pair p = b * heads + h.
// Dynamic shared memory: one head_dim vector and one row of seq scores.

struct AttentionShape {
  int64_t seq, channels, heads, hd;
  float scale;
};

__global__ void attention_forward_kernel(const float* qkv, AttentionShape sh, float* att, float* out) {
  extern __shared__ float smem[];
  float* q = smem;
  float* a = smem + sh.hd;
  const int64_t p = blockIdx.x / sh.seq, t = blockIdx.x % sh.seq, b = p / sh.heads, h = p % sh.heads;
  const int64_t stride = 3 * sh.channels;
  const float* base = qkv + b * sh.seq * stride + h * sh.hd;  // q of row (b, 0), head h
  for (int64_t d = threadIdx.x; d < sh.hd; d += blockDim.x) q[d] = base[t * stride + d];
  __syncthreads();
  float local_max = -INFINITY;
  for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float* k = base + t2 * stride + sh.channels;
    float s = 0.0f;
    for (int64_t d = 0; d < sh.hd; ++d) s += q[d] * k[d];
    a[t2] = s * sh.scale;
    local_max = fmaxf(local_max, a[t2]);
  }
  const float m = block_max(local_max);
  float local_sum = 0.0f;
  for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    a[t2] = expf(a[t2] - m);
    local_sum += a[t2];
  }
  const float inv = 1.0f / block_sum(local_sum);
  float* arow = att + (p * sh.seq + t) * sh.seq;
  for (int64_t t2 = threadIdx.x; t2 < sh.seq; t2 += blockDim.x) {
    if (t2 <= t) a[t2] *= inv;
    arow[t2] = t2 <= t ? a[t2] : 0.0f;
  }
  __syncthreads();
  float* o = out + (b * sh.seq + t) * sh.channels + h * sh.hd;
  for (int64_t d = threadIdx.x; d < sh.hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t t2 = 0; t2 <= t; ++t2) acc += a[t2] * base[t2 * stride + 2 * sh.channels + d];
    o[d] = acc;
  }
}

// dscore[p, t, t2] = att (datt - sum att datt) scale, datt[t2] = dout_t . v_t2.
__global__ void attention_dscore_kernel(const float* qkv, const float* att, const float* dout, AttentionShape sh,
                                        float* dscore) {
  extern __shared__ float smem[];
  float* g = smem;
  float* datt = smem + sh.hd;
  const int64_t p = blockIdx.x / sh.seq, t = blockIdx.x % sh.seq, b = p / sh.heads, h = p % sh.heads;
  const int64_t stride = 3 * sh.channels;
  const float* base = qkv + b * sh.seq * stride + h * sh.hd;
  for (int64_t d = threadIdx.x; d < sh.hd; d += blockDim.x) g[d] = dout[(b * sh.seq + t) * sh.channels + h * sh.hd + d];
  __syncthreads();
  const float* arow = att + (p * sh.seq + t) * sh.seq;
  float local = 0.0f;
  for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float* v = base + t2 * stride + 2 * sh.channels;
    float s = 0.0f;
    for (int64_t d = 0; d < sh.hd; ++d) s += g[d] * v[d];
    datt[t2] = s;
    local += arow[t2] * s;
  }
  const float expected = block_sum(local);
  float* srow = dscore + (p * sh.seq + t) * sh.seq;
  for (int64_t t2 = threadIdx.x; t2 < sh.seq; t2 += blockDim.x) {
    srow[t2] = t2 <= t ? arow[t2] * (datt[t2] - expected) * sh.scale : 0.0f;
  }
}

// Row r of pair p: dq_r = sum_{t2 <= r} dscore[r, t2] k_t2; dk_r = sum_{t >= r}
// dscore[t, r] q_t; dv_r = sum_{t >= r} att[t, r] dout_t; each in order.
__global__ void attention_dqkv_kernel(const float* qkv, const float* att, const float* dout, const float* dscore,
                                      AttentionShape sh, float* dqkv) {
  const int64_t p = blockIdx.x / sh.seq, r = blockIdx.x % sh.seq, b = p / sh.heads, h = p % sh.heads;
  const int64_t stride = 3 * sh.channels;
  const float* base = qkv + b * sh.seq * stride + h * sh.hd;
  const float* g = dout + b * sh.seq * sh.channels + h * sh.hd;
  const float* s = dscore + p * sh.seq * sh.seq;
  const float* a = att + p * sh.seq * sh.seq;
  float* d_row = dqkv + (b * sh.seq + r) * stride + h * sh.hd;
  for (int64_t d = threadIdx.x; d < sh.hd; d += blockDim.x) {
    float dq = 0.0f, dk = 0.0f, dv = 0.0f;
    for (int64_t t2 = 0; t2 <= r; ++t2) dq += s[r * sh.seq + t2] * base[t2 * stride + sh.channels + d];
    for (int64_t t = r; t < sh.seq; ++t) {
      dk += s[t * sh.seq + r] * base[t * stride + d];
      dv += a[t * sh.seq + r] * g[t * sh.channels + d];
    }
    d_row[d] = dq;
    d_row[sh.channels + d] = dk;
    d_row[2 * sh.channels + d] = dv;
  }
}

AttentionShape attention_shape(int64_t batch, int64_t seq, int64_t channels, int64_t heads) {
  MP_ENFORCE(batch >= 0 && seq >= 0, "attention over batch ", batch, ", seq ", seq);
  MP_ENFORCE(heads > 0 && channels > 0 && channels % heads == 0, heads, " heads do not divide ", channels,
             " channels");
  MP_ENFORCE(batch * heads * seq <= INT32_MAX, "attention grid of ", batch * heads * seq, " blocks");
  const int64_t hd = channels / heads;
  MP_ENFORCE((seq + hd) * static_cast<int64_t>(sizeof(float)) <= 48 * 1024, "attention row of seq ", seq,
             " and head_dim ", hd, " exceeds 48 KiB of shared memory");
  return AttentionShape{seq, channels, heads, hd, 1.0f / sqrtf(static_cast<float>(hd))};
}

}  // namespace

void gpt_attention_forward_cuda(const float* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads,
                                float* att, float* out, cudaStream_t stream) {
  const AttentionShape sh = attention_shape(batch, seq, channels, heads);
  const int64_t blocks = batch * heads * seq;
  if (blocks == 0) return;
  MP_ENFORCE(qkv && att && out, "attention of null memory");
  launch_kernel(&attention_forward_kernel,
                gpu_shapes::attention_rows("attention_forward_kernel", batch, seq, channels, heads), stream, qkv, sh,
                att, out);
}

int64_t gpt_attention_backward_cuda_scratch_elements(int64_t batch, int64_t seq, int64_t heads) {
  return batch * heads * seq * seq;
}

void gpt_attention_backward_cuda(const float* qkv, const float* att, const float* dout, int64_t batch,
                                 int64_t seq, int64_t channels, int64_t heads, float* scratch, float* dqkv,
                                 cudaStream_t stream) {
  const AttentionShape sh = attention_shape(batch, seq, channels, heads);
  const int64_t blocks = batch * heads * seq;
  if (blocks == 0) return;
  MP_ENFORCE(qkv && att && dout && scratch && dqkv, "attention backward of null memory");
  launch_kernel(&attention_dscore_kernel,
                gpu_shapes::attention_rows("attention_dscore_kernel", batch, seq, channels, heads), stream, qkv, att,
                dout, sh, scratch);
  launch_kernel(&attention_dqkv_kernel, gpu_shapes::attention_dqkv(batch, seq, channels, heads), stream, qkv, att,
                dout, static_cast<const float*>(scratch), sh, dqkv);
}

}  // namespace mp

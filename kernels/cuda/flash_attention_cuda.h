// kernels/cuda/flash_attention_cuda.h: causal multi-head self-attention
// without the T x T matrix (FlashAttention's online softmax, Dao et al.
// 2022), forward and backward, on the GPT's qkv layout, in fp32. gpt_attention_forward_cuda
// (tests/gpu/reference_attention.h), which keeps the probabilities, stays as the
// tests' reference.
//
// Note [Flash attention kernels]
// - Layout as gpt_attention_forward_cuda: qkv [batch * seq, 3 channels]
//   holds q | k | v per row, head h at columns h * head_dim of each third;
//   out [batch * seq, channels]. Scores are (q . k) / sqrt(head_dim) over
//   keys t2 <= t. Any head_dim up to 128 (the GPT-2 sizes 64 and 128, and the
//   small test models' 8 .. 32); fp32 in and out, fp32 accumulation.
// - Forward: a block of kFlashRows warps takes kFlashRows consecutive query
//   rows of one (batch, head), one warp per row. It walks the keys in tiles
//   of 32 staged in shared memory: lane j scores key j of the tile, the warp
//   updates the row's running max m and sum l (online softmax) and the
//   output accumulator (each lane owns head_dim / 32 of the row's columns).
//   Memory: the tiles, and lse [batch, heads, seq] = m + log l, saved for
//   the backward: O(seq), nothing of size seq^2.
// - Backward, from q, k, v, out, dout and lse (recomputing the
//   probabilities p = exp(score - lse)), in three kernels without atomics:
//   delta[t] = dout[t] . out[t]; dq per query row (keys in tiles, ascending);
//   dk and dv per key row (queries in tiles, ascending). ds = p (dout . v -
//   delta). Each kernel writes its own columns of dqkv (overwritten).
// - Deterministic: every output element is summed by one lane in a fixed
//   order, with fixed-tree warp reductions; the same inputs give the same
//   bits run to run. The bits differ from the reference kernel's (another
//   summation order, exp of a different argument), within fp32 rounding.
// - Asynchronous on `stream`; shapes are checked on the host (EnforceError).
// - fp32 on CUDA cores: the attention of the fp32 and tf32 recipes, any
//   head size up to 128; the bf16 recipes' where cuDNN's fused attention
//   does not take the shape (kernels/cuda/attention_cuda.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mp {

inline constexpr int64_t kFlashMaxHeadDim = 128;

// lse: batch * heads * seq floats.
void flash_attention_forward_cuda(const float* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads,
                                  float* out, float* lse, cudaStream_t stream);

// The scratch of flash_attention_backward_cuda: batch * heads * seq floats (delta).
int64_t flash_attention_backward_scratch_elements(int64_t batch, int64_t seq, int64_t heads);

// Overwrites dqkv [batch * seq, 3 channels].
void flash_attention_backward_cuda(const float* qkv, const float* out, const float* lse, const float* dout,
                                   int64_t batch, int64_t seq, int64_t channels, int64_t heads, float* scratch,
                                   float* dqkv, cudaStream_t stream);

}  // namespace mp

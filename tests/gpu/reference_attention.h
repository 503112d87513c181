// tests/gpu/reference_attention.h: causal multi-head self-attention that
// keeps the probabilities, the reference of the flash kernels
// (kernels/cuda/flash_attention_cuda.h) in the GPU tests. fp32, on `stream`,
// deterministic, shapes and null pointers checked on the host, as Note [GPT
// CUDA kernels] in kernels/cuda/gpt_ops_cuda.h; launched with
// gpu_shapes::attention_rows and attention_dqkv (tests/gpu/gpu_shapes.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mp {

// qkv [rows, 3 channels] holds q | k | v per row, head h at columns h * head_dim
// of each third. att [batch, heads, seq, seq] := softmax(q k^T / sqrt(head_dim))
// over keys t2 <= t (zero above the diagonal); out [rows, channels] := att v.
// One block per (batch, head, query row).
void gpt_attention_forward_cuda(const float* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads,
                                float* att, float* out, cudaStream_t stream);

// The scratch of gpt_attention_backward_cuda: the score gradients, batch *
// heads * seq * seq floats (more than the CPU op's batch * heads * seq).
int64_t gpt_attention_backward_cuda_scratch_elements(int64_t batch, int64_t seq, int64_t heads);

// Overwrites dqkv [rows, 3 channels]. First one block per (batch, head, query
// row) writes dscore into scratch; then one block per (batch, head, row r)
// writes row r's dq (sum over keys t2 <= r in order), dk and dv (sums over
// queries t >= r in order).
void gpt_attention_backward_cuda(const float* qkv, const float* att, const float* dout, int64_t batch,
                                 int64_t seq, int64_t channels, int64_t heads, float* scratch, float* dqkv,
                                 cudaStream_t stream);

}  // namespace mp

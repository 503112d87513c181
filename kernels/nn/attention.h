// kernels/nn/attention.h: causal multi-head self-attention of a GPT as ops
// on a stream (Note [Op dispatch] in kernels/dispatch.h). qkv [rows, 3 C]
// holds q | k | v per row (head h at columns h * head_dim of each third),
// out [rows, C] the heads side by side; scores (q . k) / sqrt(head_dim) over
// keys t2 <= t.
//
// The two devices keep different state between forward and backward, in
// the caller's `saved` buffer (attention_saved_elements):
// - CPU (gpt_attention_forward in kernels/cpu/gpt_ops.h): the softmax
//   probabilities [batch, heads, seq, seq], fp32 throughout;
// - CUDA (kernels/cuda/flash_attention_cuda.h): FlashAttention, no T x T
//   matrix, only the row log-sum-exp [batch, heads, seq]; on tensor cores
//   (bf16 q, k, v and probabilities, fp32 accumulation, as PyTorch's bf16
//   flash attention) or in fp32 on CUDA cores (Attention::tensor_cores).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/dispatch.h"

namespace mp::nn {

struct Attention {
  int64_t batch = 0, seq = 0, channels = 0, heads = 0;
  bool tensor_cores = false;  // CUDA: the tensor-core kernels (head sizes 64 and 128)
};

// Which CUDA attention a GPT uses: kAuto takes tensor cores for bf16 GEMMs
// (matmul_dtype) and head sizes they support, else fp32.
enum class AttentionKernel : uint8_t { kAuto = 0, kFp32 = 1, kTensorCores = 2 };
// Whether attention of head size `head_dim` runs on tensor cores;
// ConfigError for kTensorCores with a head size they do not take.
bool attention_on_tensor_cores(AttentionKernel kernel, int64_t head_dim, DType matmul_dtype);

// fp32 elements of the state kept from forward to backward, and of the
// backward's scratch, on `device`.
int64_t attention_saved_elements(Device device, const Attention& a);
int64_t attention_scratch_elements(Device device, const Attention& a);

void attention_forward(const OpContext& cx, const Attention& a, const float* qkv, float* out, float* saved);

// Overwrites dqkv [rows, 3 C].
void attention_backward(const OpContext& cx, const Attention& a, const float* qkv, const float* out,
                        const float* saved, const float* dout, float* scratch, float* dqkv);

}  // namespace mp::nn

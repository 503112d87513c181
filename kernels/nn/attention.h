// kernels/nn/attention.h: causal multi-head self-attention of a GPT as ops
// on a stream (Note [Op dispatch] in kernels/dispatch.h). qkv [rows, 3 C]
// holds q | k | v per row (head h at columns h * head_dim of each third),
// out [rows, C] the heads side by side; scores (q . k) / sqrt(head_dim) over
// keys t2 <= t. qkv, out and their gradients are activations (kernels/
// act.h): fp32, or bf16 values in the bf16 recipes.
//
// The two devices keep different state between forward and backward, in
// the caller's `saved` buffer (attention_saved_elements):
// - CPU (kernels/cpu/attention.h): the softmax probabilities [batch,
//   heads, seq, seq], fp32 throughout on the inputs' fp32 values, the
//   outputs rounded to bf16 where they hold bf16 values;
// - CUDA (kernels/cuda/attention_cuda.h): only the row log-sum-exp [batch,
//   heads, seq]. bf16 activations go to cuDNN's fused attention (as
//   PyTorch's SDPA: bf16 q, k, v and probabilities on tensor cores, fp32
//   statistics and accumulation) where cuDNN takes the shape; fp32 ones, and
//   shapes cuDNN refuses, to the fp32 flash kernels (on fp32 copies of bf16
//   inputs, the outputs rounded back).
#pragma once

#include <cstdint>
#include <string>

#include "core/device.h"
#include "core/dtype.h"
#include "kernels/act.h"
#include "kernels/dispatch.h"

namespace mp::nn {

// Which CUDA attention a GPT uses: kAuto takes cuDNN for bf16 activations
// where cuDNN takes the shape (else the fp32 flash kernels, and the run log
// says why), kFp32 always the fp32 flash kernels, kCudnn cuDNN or a
// ConfigError naming why not.
enum class AttentionKernel : uint8_t { kAuto = 0, kFp32 = 1, kCudnn = 2 };

struct Attention {
  int64_t batch = 0, seq = 0, channels = 0, heads = 0;
  bool bf16 = false;   // q, k, v hold bf16 values
  bool cudnn = false;  // CUDA: cuDNN's fused attention
  std::string note;    // CUDA: which kernels run, and why (for the run log)
};

// The attention of one block on `device` (for CUDA the current device:
// asking cuDNN whether it takes the shape builds and caches its graphs).
Attention attention_plan(Device device, AttentionKernel kernel, int64_t batch, int64_t seq, int64_t channels,
                         int64_t heads, bool bf16);

// fp32 elements of the state kept from forward to backward, and bytes of
// the ops' scratch, on `device`.
int64_t attention_saved_elements(Device device, const Attention& a);
int64_t attention_scratch_bytes(Device device, const Attention& a);

void attention_forward(const OpContext& cx, const Attention& a, Act qkv, Act out, float* saved, void* scratch);

// Overwrites dqkv [rows, 3 C].
void attention_backward(const OpContext& cx, const Attention& a, Act qkv, Act out, const float* saved, Act dout,
                        void* scratch, Act dqkv);

}  // namespace mp::nn

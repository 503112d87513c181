// kernels/cuda/attention_cuda.h: the GPT's causal attention on a CUDA
// device, the CUDA bodies of kernels/nn/attention.h: cuDNN's fused SDPA for
// bf16 activations where cuDNN takes the shape (kernels/cuda/
// attention_cudnn.h), else the fp32 flash kernels (kernels/cuda/
// flash_attention_cuda.h), on fp32 copies of bf16 inputs with their outputs
// rounded back. Both keep the row log-sum-exp [batch, heads, seq] (fp32)
// from forward to backward in `saved`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/act.h"

namespace mp {

struct AttentionCudaShape {
  int64_t batch = 0, seq = 0, channels = 0, heads = 0;
};

// Whether cuDNN's fused attention takes this shape on the current device
// (building and caching its graphs); where not, *why says why ("mp was
// built without cuDNN", or cuDNN's reason), and where it does, which cuDNN
// (version and library file) and frontend run it: the run log's line.
bool attention_cudnn_takes(const AttentionCudaShape& shape, std::string* why);
// Which cuDNN this process loads: "cuDNN 91900 at PATH, frontend 1.32.0",
// "not loaded: ..." or "mp was built without cuDNN". Never throws.
std::string attention_cudnn_library();

// The ops' scratch on the current device, bytes: cuDNN's workspace, or the
// fp32 copies and the flash backward's scratch.
int64_t attention_cuda_scratch_bytes(const AttentionCudaShape& shape, bool cudnn, bool bf16);

// out [rows, C] and saved [batch, heads, seq] from qkv [rows, 3 C].
void attention_forward_cuda(const AttentionCudaShape& shape, bool cudnn, Act qkv, Act out, float* saved,
                            void* scratch, cudaStream_t stream);

// Overwrites dqkv [rows, 3 C].
void attention_backward_cuda(const AttentionCudaShape& shape, bool cudnn, Act qkv, Act out, const float* saved,
                             Act dout, void* scratch, Act dqkv, cudaStream_t stream);

}  // namespace mp

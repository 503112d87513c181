// kernels/nn/embedding.h: the token and position embeddings of a GPT, as
// ops on a stream (Note [Op dispatch] in kernels/dispatch.h). CPU bodies:
// kernels/cpu/gpt_ops.h; CUDA bodies: kernels/cuda/gpt_ops_cuda.h. Row n of
// the activations is token n = b * seq + t of the micro-batch.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/dispatch.h"

namespace mp::nn {

// out[n, :] = wte[tokens[n], :] + wpe[n % seq, :]; wte [vocab_rows, C] in
// fp32 or bf16 (widened exactly, only the rows read). A token outside
// [0, vocab_rows) fails the op (CPU) or writes NaN into its row (CUDA).
void embedding_forward(const OpContext& cx, const int32_t* tokens, const void* wte, DType wte_dtype, const float* wpe,
                       int64_t batch, int64_t seq, int64_t channels, int64_t vocab_rows, float* out);

// The scratch embedding_backward needs on `device` (0 on the CPU; CUDA:
// the sort's, with the device current).
int64_t embedding_backward_workspace_bytes(Device device, int64_t rows, int64_t vocab_rows);

// Accumulates: dwte[tokens[n], :] += dout[n, :] and dwpe[n % seq, :] +=
// dout[n, :], n in increasing order (the same additions in the same order
// on both devices).
void embedding_backward(const OpContext& cx, const int32_t* tokens, const float* dout, int64_t batch, int64_t seq,
                        int64_t channels, int64_t vocab_rows, float* dwte, float* dwpe, void* workspace,
                        int64_t workspace_bytes);

}  // namespace mp::nn

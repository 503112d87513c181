// kernels/cuda/gpt_ops_cuda.h: the GPT-2 layer math on a CUDA device, in
// fp32: the device twins of kernels/cpu/gpt_ops.h (same formulas, layouts and
// "accumulates" / "overwrites" contracts; Note [GPT op math] there), the
// CUDA bodies of the model ops in kernels/nn/. Their GEMMs (the Conv1D
// matmuls, the tied head) are gemm_cuda calls (kernels/cuda/gemm_cublaslt.h)
// with the GemmProblems kernels/nn/gemm.cc and models/gpt.cc build, and the
// attention is kernels/cuda/flash_attention_cuda.h; this file has
// everything else.
//
// Note [GPT CUDA kernels]
// - Every pointer is device memory; every call is asynchronous on `stream`
//   and checks its launches (a bad launch throws CudaError; a fault surfaces
//   from a later CUDA call). Shapes and null pointers are checked on the host
//   (EnforceError); zero-sized calls launch nothing.
// - Deterministic: every output element is computed by one thread in an order
//   that depends only on the shapes; reductions run in a fixed tree order;
//   there are no floating-point atomics. The same inputs give the same bits
//   on every run (on one GPU model and toolkit). The per-element formulas
//   (GELU, LayerNorm, the loss's exp) are the CPU ops' own, from
//   kernels/gpt_math.h; the bits still differ from the CPU ops' (other
//   summation orders, FMA contraction, CUDA's expf in attention), within
//   fp32 rounding.
// - Token and target ids are checked by the CPU ops (EnforceError); a kernel
//   cannot throw, so here an id outside its range writes NaN where it is used
//   (the embedding row, the row's loss and gradient) and adds nothing to
//   the wte gradient: never an out-of-bounds access, and the NaN reaches the
//   loss and the gradient statistics.
// - Cross-row reductions (layernorm dw, db; bias db) are two passes: fixed
//   chunks of rows give per-chunk partial sums in the caller's workspace,
//   then one thread per column adds the chunks in order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace mp {

// ---- embedding --------------------------------------------------------------
// out[n, :] = wte[tokens[n], :] + wpe[n % seq, :]; wte has vocab_rows rows.
void gpt_embedding_forward_cuda(const int32_t* tokens, const float* wte, const float* wpe, int64_t batch,
                                int64_t seq, int64_t channels, int64_t vocab_rows, float* out, cudaStream_t stream);
// The same with wte in bf16 (each element widened exactly): the bits of the
// fp32 version on the widened table, reading only the rows it needs.
void gpt_embedding_forward_cuda(const int32_t* tokens, const bf16* wte, const float* wpe, int64_t batch,
                                int64_t seq, int64_t channels, int64_t vocab_rows, float* out, cudaStream_t stream);

// Workspace of gpt_embedding_backward_cuda (needs a current device: it asks
// CUB for its radix-sort scratch).
int64_t gpt_embedding_backward_cuda_workspace_bytes(int64_t rows, int64_t vocab_rows);

// Accumulates: dwte[tokens[n], :] += dout[n, :] and dwpe[n % seq, :] +=
// dout[n, :], over n in increasing order (so the same bits as the CPU op's
// float instantiation: the same additions in the same order). The rows are
// grouped by token with a stable radix sort (CUB), then one thread per
// (token, channel) adds its rows in row order; one thread per (position,
// channel) adds the batch rows in order. `workspace` holds at least
// gpt_embedding_backward_cuda_workspace_bytes(batch * seq, vocab_rows).
void gpt_embedding_backward_cuda(const int32_t* tokens, const float* dout, int64_t batch, int64_t seq,
                                 int64_t channels, int64_t vocab_rows, float* dwte, float* dwpe, void* workspace,
                                 int64_t workspace_bytes, cudaStream_t stream);

// ---- bias gradient ---------------------------------------------------------------
int64_t gpt_bias_backward_cuda_workspace_bytes(int64_t rows, int64_t out);

// Overwrites db[out] with the column sums of dy[rows, out] (two passes).
// `workspace`: gpt_bias_backward_cuda_workspace_bytes(rows, out).
void gpt_bias_backward_cuda(const float* dy, int64_t rows, int64_t out, float* db, void* workspace,
                            cudaStream_t stream);

// ---- loss -----------------------------------------------------------------------
// The cross-entropy of softmax(logits[n, 0 .. vocab)) at targets[n] for
// `rows` rows of a loss over `loss_rows` >= rows rows; rows have stride
// padded_vocab >= vocab and the padding columns are ignored. Overwrites
// row_loss [rows] and dlogits [rows, padded_vocab] with (softmax - onehot) /
// loss_rows (zero on the padding); dlogits may alias logits. One block per
// row. (The MLP's loss; the GPT's is the fused classifier,
// kernels/cuda/classifier_cuda.h.)
void gpt_softmax_xent_rows_cuda(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                                int64_t padded_vocab, int64_t loss_rows, float* row_loss, float* dlogits,
                                cudaStream_t stream);

// mean_loss (device) := the mean of row_loss [rows > 0], summed in double.
void gpt_mean_loss_cuda(const float* row_loss, int64_t rows, double* mean_loss, cudaStream_t stream);

}  // namespace mp

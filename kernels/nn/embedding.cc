#include "kernels/nn/embedding.h"

#include "core/error.h"
#include "kernels/cpu/embedding.h"
#if MP_WITH_CUDA
#include "kernels/cuda/gpt_ops_cuda.h"
#endif

namespace mp::nn {

void embedding_forward(const OpContext& cx, const int32_t* tokens, const void* wte, DType wte_dtype, const float* wpe,
                       int64_t batch, int64_t seq, int64_t channels, int64_t vocab_rows, float* out) {
  MP_ENFORCE(wte_dtype == DType::kF32 || wte_dtype == DType::kBF16, "embedding table in ", dtype_name(wte_dtype));
  const int threads = cx.threads;
  const auto run = [&](const auto* w) {  // the table as its element type
    cx.run(
        "embedding forward", OpFamily::kEmbedding,
        [=] { gpt_embedding_forward(tokens, w, wpe, batch, seq, channels, vocab_rows, out, threads); },
        MP_CUDA_BODY(gpt_embedding_forward_cuda(tokens, w, wpe, batch, seq, channels, vocab_rows, out, cuda_stream)));
  };
  if (wte_dtype == DType::kBF16) return run(static_cast<const bf16*>(wte));
  run(static_cast<const float*>(wte));
}

int64_t embedding_backward_workspace_bytes(Device device, [[maybe_unused]] int64_t rows,
                                           [[maybe_unused]] int64_t vocab_rows) {
  if (device.is_cpu()) return 0;
#if MP_WITH_CUDA
  return gpt_embedding_backward_cuda_workspace_bytes(rows, vocab_rows);
#else
  MP_THROW(ConfigError, "embedding on ", device, ": mp was built without CUDA");
#endif
}

void embedding_backward(const OpContext& cx, const int32_t* tokens, const float* dout, int64_t batch, int64_t seq,
                        int64_t channels, int64_t vocab_rows, float* dwte, float* dwpe, void* workspace,
                        int64_t workspace_bytes) {
  const int threads = cx.threads;
  cx.run(
      "embedding backward", OpFamily::kEmbedding,
      [=] { gpt_embedding_backward(tokens, dout, batch, seq, channels, dwte, dwpe, threads); },
      MP_CUDA_BODY(gpt_embedding_backward_cuda(tokens, dout, batch, seq, channels, vocab_rows, dwte, dwpe, workspace,
                                               workspace_bytes, cuda_stream)));
  (void)workspace;
  (void)workspace_bytes;
  (void)vocab_rows;
}

}  // namespace mp::nn

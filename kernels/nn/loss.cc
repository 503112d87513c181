#include "kernels/nn/loss.h"

#include "kernels/cpu/gpt_ops.h"
#if MP_WITH_CUDA
#include "kernels/cuda/gpt_ops_cuda.h"
#endif

namespace mp::nn {

void softmax_xent(const OpContext& cx, const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                  int64_t padded_vocab, int64_t loss_rows, float* row_loss, float* dlogits, DType storage,
                  void* dlogits16) {
  const int threads = cx.threads;
  cx.run(
      "softmax cross-entropy", OpFamily::kSoftmaxXent,
      [=] {
        gpt_softmax_xent_rows(logits, targets, rows, vocab, padded_vocab, loss_rows, row_loss, dlogits, storage,
                              dlogits16, threads);
      },
      MP_CUDA_BODY(
          gpt_softmax_xent_rows_cuda(logits, targets, rows, vocab, padded_vocab, loss_rows, row_loss, dlogits,
                                     cuda_stream);
          if (dlogits16 != nullptr) {
            gpt_round_to_bf16_cuda(dlogits, rows * padded_vocab, storage, dlogits16, cuda_stream);
          }));
}

void mean_loss(const OpContext& cx, const float* row_loss, int64_t rows, double* mean) {
  cx.run("mean loss", OpFamily::kSoftmaxXent, [=] { *mean = gpt_mean_loss(row_loss, rows); },
         MP_CUDA_BODY(gpt_mean_loss_cuda(row_loss, rows, mean, cuda_stream)));
}

}  // namespace mp::nn

#include "kernels/nn/loss.h"

#include "kernels/cpu/loss.h"
#if MP_WITH_CUDA
#include "kernels/cuda/classifier_cuda.h"
#include "kernels/cuda/gpt_ops_cuda.h"
#endif

namespace mp::nn {

void classifier(const OpContext& cx, Act logits, const int32_t* targets, int64_t rows, int64_t vocab,
                int64_t padded_vocab, int64_t loss_rows, float* row_loss) {
  const int threads = cx.threads;
  cx.run(
      "classifier", OpFamily::kSoftmaxXent,
      [=] { gpt_classifier(logits, targets, rows, vocab, padded_vocab, loss_rows, row_loss, threads); },
      MP_CUDA_BODY(
          gpt_classifier_cuda(logits, targets, rows, vocab, padded_vocab, loss_rows, row_loss, cuda_stream)));
}

void mean_loss(const OpContext& cx, const float* row_loss, int64_t rows, double* mean) {
  cx.run("mean loss", OpFamily::kSoftmaxXent, [=] { *mean = gpt_mean_loss(row_loss, rows); },
         MP_CUDA_BODY(gpt_mean_loss_cuda(row_loss, rows, mean, cuda_stream)));
}

}  // namespace mp::nn

// kernels/cpu/loss.cc: kernels/cpu/loss.h.
#include "kernels/cpu/loss.h"

#include <algorithm>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/layer_loops.h"
#include "kernels/cpu/layer_parts.h"
#include "kernels/op_profile.h"

namespace mp {

using layer::check_act;
using layer::check_token;
using layer::kChunk;

// ---- loss -----------------------------------------------------------------------

double gpt_mean_loss(const float* row_loss, int64_t rows) {
  ScopedOp op(OpFamily::kSoftmaxXent);
  MP_ENFORCE_GT(rows, 0, "mean loss of no rows");
  double total = 0.0;  // in double, in row order
  for (int64_t n = 0; n < rows; ++n) total += static_cast<double>(row_loss[n]);
  return total / static_cast<double>(rows);
}

// ---- classifier -------------------------------------------------------------------

void gpt_classifier(Act logits, const int32_t* targets, int64_t rows, int64_t vocab, int64_t padded_vocab,
                    int64_t loss_rows, float* row_loss, int threads) {
  ScopedOp op(OpFamily::kSoftmaxXent);
  check_act(logits, "logits");
  MP_ENFORCE(vocab > 0 && vocab <= padded_vocab, "vocab ", vocab, " with padded vocab ", padded_vocab);
  MP_ENFORCE(rows <= loss_rows, "a chunk of ", rows, " rows of a loss over ", loss_rows);
  for (int64_t n = 0; n < rows; ++n) check_token(targets[n], vocab, n, "target");
  const ClassifierLoopArgs a{
      logits.data, logits.dtype, logits.bf16, targets, vocab, padded_vocab, 1.0f / static_cast<float>(loss_rows),
      row_loss};
  parallel_for(rows, threads, std::max<int64_t>(1, kChunk / std::max<int64_t>(vocab, 1)), [&](int64_t n0, int64_t n1) {
    layer_loops().classifier(a, thread_floats(ThreadFloats::kLayerLoops, padded_vocab), n0, n1);
  });
}

}  // namespace mp

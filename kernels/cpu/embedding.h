// kernels/cpu/embedding.h: the token and position embedding on the CPU (Note [Layer ops on the CPU] in
// kernels/cpu/layer_parts.h): the template over T (float for the model, double for the float64 reference of the tests)
// and a bf16 table.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/act.h"

namespace mp {

// ---- embedding --------------------------------------------------------------
// out[n, :] = wte[tokens[n], :] + wpe[n % seq, :]. wte has vocab_rows rows;
// every token must lie in [0, vocab_rows) (EnforceError otherwise).
template <class T>
void gpt_embedding_forward(const int32_t* tokens, const T* wte, const T* wpe, int64_t batch, int64_t seq,
                           int64_t channels, int64_t vocab_rows, T* out, int threads);
// The same with wte in bf16 (each element widened exactly): the bits of the
// fp32 version on the widened table, reading only the rows it needs.
void gpt_embedding_forward(const int32_t* tokens, const bf16* wte, const float* wpe, int64_t batch, int64_t seq,
                           int64_t channels, int64_t vocab_rows, float* out, int threads);

// Accumulates: dwte[tokens[n], :] += dout[n, :] and dwpe[n % seq, :] +=
// dout[n, :], over n in increasing order.
template <class T>
void gpt_embedding_backward(const int32_t* tokens, const T* dout, int64_t batch, int64_t seq, int64_t channels, T* dwte,
                            T* dwpe, int threads);

}  // namespace mp

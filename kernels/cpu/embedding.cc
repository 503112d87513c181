// kernels/cpu/embedding.cc: kernels/cpu/embedding.h.
#include "kernels/cpu/embedding.h"

#include <type_traits>

#include "core/parallel.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/layer_parts.h"
#include "kernels/gpt_math.h"
#include "kernels/op_profile.h"

namespace mp {

using layer::check_token;
using layer::part_align;

// ---- embedding --------------------------------------------------------------

namespace {

// out[n, :] = wte[tokens[n], :] (widened exactly to T) + wpe[n % seq, :].
template <class E, class T>
void embedding_forward(const int32_t* tokens, const E* wte, const T* wpe, int64_t batch, int64_t seq, int64_t channels,
                       int64_t vocab_rows, T* out, int threads) {
  ScopedOp op(OpFamily::kEmbedding);
  parallel_for(batch * seq, threads, part_align(channels, 1), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      check_token(tokens[n], vocab_rows, n, "token");
      const E* e = wte + tokens[n] * channels;
      const T* p = wpe + (n % seq) * channels;
      T* o = out + n * channels;
      for (int64_t c = 0; c < channels; ++c) {
        if constexpr (std::is_same_v<E, bf16>) {
          o[c] = math::to_f32(e[c]) + p[c];
        } else {
          o[c] = e[c] + p[c];
        }
      }
    }
  });
}

}  // namespace

template <class T>
void gpt_embedding_forward(const int32_t* tokens, const T* wte, const T* wpe, int64_t batch, int64_t seq,
                           int64_t channels, int64_t vocab_rows, T* out, int threads) {
  embedding_forward(tokens, wte, wpe, batch, seq, channels, vocab_rows, out, threads);
}

void gpt_embedding_forward(const int32_t* tokens, const bf16* wte, const float* wpe, int64_t batch, int64_t seq,
                           int64_t channels, int64_t vocab_rows, float* out, int threads) {
  embedding_forward(tokens, wte, wpe, batch, seq, channels, vocab_rows, out, threads);
}

template <class T>
void gpt_embedding_backward(const int32_t* tokens, const T* dout, int64_t batch, int64_t seq, int64_t channels, T* dwte,
                            T* dwpe, int threads) {
  ScopedOp op(OpFamily::kEmbedding);
  const int64_t rows = batch * seq;
  // The thread owning channels [c0, c1) adds every row into them in row order.
  parallel_for(channels, threads, part_align(rows, 8), [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < rows; ++n) {
      const T* g = dout + n * channels;
      T* e = dwte + tokens[n] * channels;
      T* p = dwpe + (n % seq) * channels;
      for (int64_t c = c0; c < c1; ++c) {
        e[c] += g[c];
        p[c] += g[c];
      }
    }
  });
}

#define MP_INSTANTIATE(T)                                                                                            \
  template void gpt_embedding_forward<T>(const int32_t*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, T*, \
                                         int);                                                                       \
  template void gpt_embedding_backward<T>(const int32_t*, const T*, int64_t, int64_t, int64_t, T*, T*, int);

MP_INSTANTIATE(float)
MP_INSTANTIATE(double)
#undef MP_INSTANTIATE

}  // namespace mp

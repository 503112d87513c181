// kernels/cpu/gpt_act_ops.cc: the GPT ops on activations that may hold bf16
// values (kernels/cpu/gpt_act_ops.h): the float loops of kernels/cpu/
// gpt_loops.h, told where an input or output holds bf16 values.
#include "kernels/cpu/gpt_act_ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/gpt_loops.h"
#include "kernels/cpu/gpt_ops.h"
#include "kernels/op_profile.h"

namespace mp {
namespace {

constexpr int64_t kChunk = int64_t{1} << 14;  // elements per part of a conversion
// Multiply-adds below which another thread's wake-up costs more than it
// saves (as kernels/cpu/gpt_ops.cc's loops): parallel_for's `align` for
// items of `work` each. Only which thread computes an element depends on it.
constexpr int64_t kMinWorkPerPart = int64_t{1} << 14;
int64_t part_align(int64_t work, int64_t multiple = 1) {
  const int64_t items = std::max<int64_t>(1, kMinWorkPerPart / std::max<int64_t>(work, 1));
  return (items + multiple - 1) / multiple * multiple;
}

void check(const Act& a, const char* what) {
  MP_ENFORCE(a.data != nullptr, what, " is null");
  MP_ENFORCE(a.dtype == DType::kF32 || (a.dtype == DType::kBF16 && a.bf16), what, " stored as ",
             dtype_name(a.dtype), a.bf16 ? " holding bf16 values" : "", ": need fp32 or bf16");
}

// dst[i] := src's values widened exactly, i in [0, n).
void widen(const Act& src, float* dst, int64_t n, int threads) {
  parallel_for(n, threads, kChunk, [&](int64_t j0, int64_t j1) {
    if (src.dtype == DType::kBF16) {
      const bf16* s = static_cast<const bf16*>(src.data);
      for (int64_t j = j0; j < j1; ++j) dst[j] = math::to_f32(s[j]);
    } else {
      std::memcpy(dst + j0, src.f32() + j0, static_cast<size_t>(j1 - j0) * sizeof(float));
    }
  });
}

// dst := src (fp32 values) as dst stores them.
void store(const float* src, const Act& dst, int64_t n, int threads) {
  const GptLoops& l = gpt_loops();
  parallel_for(n, threads, kChunk, [&](int64_t j0, int64_t j1) {
    if (dst.dtype == DType::kBF16) {
      l.round_to_bf16(src, static_cast<bf16*>(dst.data), j0, j1);
    } else if (dst.bf16) {
      l.round_through_bf16(src, dst.f32(), j0, j1);
    } else {
      std::memcpy(dst.f32() + j0, src + j0, static_cast<size_t>(j1 - j0) * sizeof(float));
    }
  });
}

}  // namespace

// ---- layernorm -------------------------------------------------------------------

int64_t gpt_layernorm_act_scratch_elements(int64_t rows, int64_t channels) {
  (void)rows;
  (void)channels;
  return 0;  // the loops read and write bf16 values themselves
}

void gpt_layernorm_forward(const float* x, const float* w, const float* b, int64_t rows, int64_t channels, Act out,
                           float* mean, float* rstd, float* scratch, int threads) {
  ScopedOp op(OpFamily::kLayerNorm);
  (void)scratch;
  check(out, "layernorm output");
  LayerNormLoopArgs<float> a{x, w, b, channels, out.f32(), mean, rstd};
  if (out.dtype == DType::kBF16) {
    a.out = nullptr;
    a.out16 = static_cast<bf16*>(out.data);
  } else {
    a.round = out.bf16;
  }
  parallel_for(rows, threads, part_align(3 * channels), [&](int64_t n0, int64_t n1) {
    gpt_loops().layernorm_forward(a, n0, n1);
  });
}

void gpt_layernorm_backward(Act dout, const float* x, const float* w, const float* mean, const float* rstd,
                            int64_t rows, int64_t channels, float* dx, bool accumulate, Act dx_copy, float* dw,
                            float* db, float* scratch, int threads) {
  ScopedOp op(OpFamily::kLayerNorm);
  (void)scratch;
  check(dout, "layernorm output gradient");
  LayerNormGradLoopArgs<float> a{dout.f32(), x, w, mean, rstd, rows, channels, dx, dw, db};
  if (dout.dtype == DType::kBF16) {
    a.dout = nullptr;
    a.dout16 = static_cast<const bf16*>(dout.data);
  }
  a.accumulate = accumulate;
  if (dx_copy.data != nullptr) {
    check(dx_copy, "layernorm input gradient copy");
    if (dx_copy.dtype == DType::kBF16) {
      a.dx_copy16 = static_cast<bf16*>(dx_copy.data);
    } else {
      MP_ENFORCE(dx_copy.bf16, "layernorm input gradient copy of fp32 values: use dx itself");
      a.dx_copy = dx_copy.f32();
    }
  }
  parallel_for(rows, threads, part_align(4 * channels), [&](int64_t n0, int64_t n1) {
    gpt_loops().layernorm_grad_input(a, n0, n1);
  });
  parallel_for(channels, threads, part_align(2 * rows, 8), [&](int64_t c0, int64_t c1) {
    gpt_loops().layernorm_grad_params(a, c0, c1);
  });
}

// ---- causal self-attention ----------------------------------------------------------

int64_t gpt_attention_act_scratch_elements(int64_t batch, int64_t seq, int64_t channels, int64_t heads) {
  (void)channels;
  return batch * heads * seq;  // the backward's; bf16 values are read and written in place
}

namespace {

void check_heads(int64_t channels, int64_t heads) {
  MP_ENFORCE(heads > 0 && channels % heads == 0, heads, " heads do not divide ", channels, " channels");
}

}  // namespace

void gpt_attention_forward(Act qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads, float* att, Act out,
                           float* scratch, int threads) {
  ScopedOp op(OpFamily::kAttention);
  (void)scratch;
  check(qkv, "attention input");
  check(out, "attention output");
  check_heads(channels, heads);
  AttentionLoopArgs<float> a{qkv.f32(), nullptr, nullptr, seq, channels, heads, att, out.f32(), nullptr, nullptr};
  if (qkv.dtype == DType::kBF16) {
    a.qkv = nullptr;
    a.qkv16 = static_cast<const bf16*>(qkv.data);
  }
  if (out.dtype == DType::kBF16) {
    a.out = nullptr;
    a.out16 = static_cast<bf16*>(out.data);
  } else {
    a.round = out.bf16;
  }
  parallel_for(batch * heads, threads, part_align(seq * seq * channels / heads), [&](int64_t p0, int64_t p1) {
    gpt_loops().attention_forward(a, p0, p1);
  });
}

void gpt_attention_backward(Act qkv, const float* att, Act dout, int64_t batch, int64_t seq, int64_t channels,
                            int64_t heads, Act dqkv, float* scratch, int threads) {
  ScopedOp op(OpFamily::kAttention);
  check(qkv, "attention input");
  check(dout, "attention output gradient");
  check(dqkv, "attention input gradient");
  check_heads(channels, heads);
  AttentionLoopArgs<float> a{qkv.f32(), att, dout.f32(), seq, channels, heads, nullptr, nullptr, scratch,
                             dqkv.f32()};
  if (qkv.dtype == DType::kBF16) {
    a.qkv = nullptr;
    a.qkv16 = static_cast<const bf16*>(qkv.data);
  }
  if (dout.dtype == DType::kBF16) {
    a.dout = nullptr;
    a.dout16 = static_cast<const bf16*>(dout.data);
  }
  if (dqkv.dtype == DType::kBF16) {
    a.dqkv = nullptr;
    a.dqkv16 = static_cast<bf16*>(dqkv.data);
  } else {
    a.round = dqkv.bf16;
  }
  parallel_for(batch * heads, threads, part_align(2 * seq * seq * channels / heads), [&](int64_t p0, int64_t p1) {
    gpt_loops().attention_backward(a, p0, p1);
  });
}

// ---- classifier -------------------------------------------------------------------

void gpt_classifier(Act logits, const int32_t* targets, int64_t rows, int64_t vocab, int64_t padded_vocab,
                    int64_t loss_rows, float* row_loss, int threads) {
  ScopedOp op(OpFamily::kSoftmaxXent);
  check(logits, "logits");
  MP_ENFORCE(vocab > 0 && vocab <= padded_vocab, "vocab ", vocab, " with padded vocab ", padded_vocab);
  MP_ENFORCE(rows <= loss_rows, "a chunk of ", rows, " rows of a loss over ", loss_rows);
  for (int64_t n = 0; n < rows; ++n) {
    MP_ENFORCE(targets[n] >= 0 && targets[n] < vocab, "target ", targets[n], " at row ", n, " outside [0, ", vocab,
               ")");
  }
  const ClassifierLoopArgs a{logits.data, logits.dtype,  logits.bf16, targets,
                             vocab,       padded_vocab,  1.0f / static_cast<float>(loss_rows), row_loss};
  parallel_for(rows, threads, std::max<int64_t>(1, kChunk / std::max<int64_t>(vocab, 1)),
               [&](int64_t n0, int64_t n1) {
                 thread_local std::vector<float> row;  // grown once, kept
                 if (static_cast<int64_t>(row.size()) < padded_vocab) row.resize(static_cast<size_t>(padded_vocab));
                 gpt_loops().classifier(a, row.data(), n0, n1);
               });
}

// ---- casts ------------------------------------------------------------------------

void gpt_convert(Act src, Act dst, int64_t n, int threads) {
  ScopedOp op(OpFamily::kCast);
  check(src, "conversion source");
  check(dst, "conversion destination");
  if (src.dtype == DType::kF32) {
    store(src.f32(), dst, n, threads);
    return;
  }
  if (dst.dtype == DType::kBF16) {
    parallel_for(n, threads, kChunk, [&](int64_t j0, int64_t j1) {
      std::memcpy(static_cast<bf16*>(dst.data) + j0, static_cast<const bf16*>(src.data) + j0,
                  static_cast<size_t>(j1 - j0) * sizeof(bf16));
    });
    return;
  }
  widen(src, dst.f32(), n, threads);
}

}  // namespace mp

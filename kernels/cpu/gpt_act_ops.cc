// kernels/cpu/gpt_act_ops.cc: the GPT ops on activations that may hold bf16
// values (kernels/cpu/gpt_act_ops.h): bf16 inputs widened into the
// caller's scratch, the float ops of gpt_ops.h, outputs rounded back.
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

// fp32 values stored as fp32: the float ops read and write it as it is.
bool plain(const Act& a) { return a.dtype == DType::kF32 && !a.bf16; }

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

// The fp32 values of `a` (n of them): a itself, or widened into *scratch
// (which then moves past them).
const float* read_f32(const Act& a, int64_t n, float** scratch, int threads) {
  if (plain(a)) return a.f32();
  float* out = *scratch;
  widen(a, out, n, threads);
  *scratch += n;
  return out;
}

// Where an op writes the fp32 values of output `a` (n of them): a itself,
// or *scratch (then stored into a by store()).
float* write_f32(const Act& a, int64_t n, float** scratch) {
  if (plain(a)) return a.f32();
  float* out = *scratch;
  *scratch += n;
  return out;
}

}  // namespace

// ---- layernorm -------------------------------------------------------------------

int64_t gpt_layernorm_act_scratch_elements(int64_t rows, int64_t channels) { return rows * channels; }

void gpt_layernorm_forward(const float* x, const float* w, const float* b, int64_t rows, int64_t channels, Act out,
                           float* mean, float* rstd, float* scratch, int threads) {
  check(out, "layernorm output");
  float* y = write_f32(out, rows * channels, &scratch);
  gpt_layernorm_forward<float>(x, w, b, rows, channels, y, mean, rstd, threads);
  if (!plain(out)) store(y, out, rows * channels, threads);
}

void gpt_layernorm_backward(Act dout, const float* x, const float* w, const float* mean, const float* rstd,
                            int64_t rows, int64_t channels, float* dx, bool accumulate, Act dx_copy, float* dw,
                            float* db, float* scratch, int threads) {
  check(dout, "layernorm output gradient");
  const int64_t n = rows * channels;
  const float* g = read_f32(dout, n, &scratch, threads);
  if (!accumulate) {
    parallel_for(n, threads, kChunk, [&](int64_t j0, int64_t j1) {
      std::fill(dx + j0, dx + j1, 0.0f);  // 0 + v is v: the bits of overwriting
    });
  }
  gpt_layernorm_backward<float>(g, x, w, mean, rstd, rows, channels, dx, dw, db, threads);
  if (dx_copy.data != nullptr) {
    check(dx_copy, "layernorm input gradient copy");
    store(dx, dx_copy, n, threads);
  }
}

// ---- causal self-attention ----------------------------------------------------------

int64_t gpt_attention_act_scratch_elements(int64_t batch, int64_t seq, int64_t channels, int64_t heads) {
  const int64_t rc = batch * seq * channels;
  // The backward's: qkv, dout and dqkv widened, then its own.
  return 7 * rc + batch * heads * seq;
}

void gpt_attention_forward(Act qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads, float* att, Act out,
                           float* scratch, int threads) {
  check(qkv, "attention input");
  check(out, "attention output");
  const int64_t rc = batch * seq * channels;
  const float* q = read_f32(qkv, 3 * rc, &scratch, threads);
  float* y = write_f32(out, rc, &scratch);
  gpt_attention_forward<float>(q, batch, seq, channels, heads, att, y, threads);
  if (!plain(out)) store(y, out, rc, threads);
}

void gpt_attention_backward(Act qkv, const float* att, Act dout, int64_t batch, int64_t seq, int64_t channels,
                            int64_t heads, Act dqkv, float* scratch, int threads) {
  check(qkv, "attention input");
  check(dout, "attention output gradient");
  check(dqkv, "attention input gradient");
  const int64_t rc = batch * seq * channels;
  const float* q = read_f32(qkv, 3 * rc, &scratch, threads);
  const float* g = read_f32(dout, rc, &scratch, threads);
  float* dq = write_f32(dqkv, 3 * rc, &scratch);
  gpt_attention_backward<float>(q, att, g, batch, seq, channels, heads, scratch, dq, threads);
  if (!plain(dqkv)) store(dq, dqkv, 3 * rc, threads);
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

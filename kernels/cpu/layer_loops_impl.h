// kernels/cpu/layer_loops_impl.h (private to kernels/cpu): the loop bodies of
// kernels/cpu/layer_loops.h, included by layer_parts.cc (the double reference's
// table) and by each layer_loops_<isa>.cc (the float variants).
//
// Everything here is in an anonymous namespace, and the table entries are
// flattened (every shared inline helper inlined into them): no out-of-line
// copy of a helper compiled for a wider ISA can leak to callers on CPUs
// without it (tests/check_isa_objects.cmake checks each object exports only
// its select function).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/convert_loop.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/layer_loops.h"
#include "kernels/cpu/loops.h"
#include "kernels/gpt_math.h"

namespace mp {
namespace {

// An element as the compute type: bf16 widened exactly, else as it is.
template <class T>
inline T widen(T x) {
  return x;
}
inline float widen(bf16 x) { return math::to_f32(x); }

// A row of fp32 values stored as an output holding bf16 values.
inline void store_bf16_row(const float* src, bf16* out16, float* out_round, int64_t n) {
  if (out16 != nullptr) {
    for (int64_t j = 0; j < n; ++j) out16[j] = math::from_f32<bf16>(src[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) out_round[j] = math::round_through_unit<bf16>(src[j]);
  }
}

template <class T>
[[gnu::flatten]] void gelu_forward_loop(const T* x, T* out, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) out[j] = math::gelu(x[j]);
}

template <class T>
[[gnu::flatten]] void gelu_backward_loop(const T* x, const T* dout, T* dx, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) dx[j] = math::gelu_grad(x[j]) * dout[j];
}

template <class T>
[[gnu::flatten]] void add_loop(const T* a, const T* b, T* out, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) out[j] = a[j] + b[j];
}

template <class T>
[[gnu::flatten]] void bias_grad_loop(const T* dy, int64_t rows, int64_t out, T* db, int64_t o0, int64_t o1) {
  std::fill(db + o0, db + o1, T(0));
  for (int64_t n = 0; n < rows; ++n) {
    const T* g = dy + n * out;
    for (int64_t o = o0; o < o1; ++o) db[o] += g[o];
  }
}

template <class T>
[[gnu::flatten]] void layernorm_forward_loop(const LayerNormLoopArgs<T>& a, int64_t n0, int64_t n1) {
  const int64_t channels = a.channels;
  const T inv_c = T(1) / static_cast<T>(channels);
  const auto eps = static_cast<T>(math::kGptLayerNormEps);
  for (int64_t n = n0; n < n1; ++n) {
    const T* xr = a.x + n * channels;
    const T m = reduce8<T>(channels, [&](int64_t j) { return xr[j]; }) * inv_c;
    const T var = reduce8<T>(channels, [&](int64_t j) { return (xr[j] - m) * (xr[j] - m); }) * inv_c;
    const T r = T(1) / std::sqrt(var + eps);
    a.mean[n] = m;
    a.rstd[n] = r;
    if constexpr (std::is_same_v<T, float>) {
      if (a.out16 != nullptr) {
        bf16* o = a.out16 + n * channels;
        for (int64_t c = 0; c < channels; ++c) o[c] = math::from_f32<bf16>(math::layernorm(xr[c], m, r, a.w[c], a.b[c]));
        continue;
      }
      if (a.round) {
        T* o = a.out + n * channels;
        for (int64_t c = 0; c < channels; ++c) {
          o[c] = math::round_through_unit<bf16>(math::layernorm(xr[c], m, r, a.w[c], a.b[c]));
        }
        continue;
      }
    }
    T* o = a.out + n * channels;
    for (int64_t c = 0; c < channels; ++c) o[c] = math::layernorm(xr[c], m, r, a.w[c], a.b[c]);
  }
}

// dx, row by row: dx += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd
// (dx := 0 + that without accumulate), and the copy of the new dx.
template <class T, class G>
void layernorm_grad_input_rows(const LayerNormGradLoopArgs<T>& a, const G* dout, int64_t n0, int64_t n1) {
  const int64_t channels = a.channels;
  const T inv_c = T(1) / static_cast<T>(channels);
  const T* w = a.w;
  for (int64_t n = n0; n < n1; ++n) {
    const G* g = dout + n * channels;
    const T* xr = a.x + n * channels;
    const T m = a.mean[n], r = a.rstd[n];
    const T dnorm_mean = reduce8<T>(channels, [&](int64_t j) { return w[j] * widen(g[j]); }) * inv_c;
    const T dnorm_norm_mean =
        reduce8<T>(channels, [&](int64_t j) { return w[j] * widen(g[j]) * ((xr[j] - m) * r); }) * inv_c;
    T* d = a.dx + n * channels;
    if (a.accumulate) {
      for (int64_t c = 0; c < channels; ++c) {
        d[c] += math::layernorm_dx(xr[c], m, r, w[c] * widen(g[c]), dnorm_mean, dnorm_norm_mean);
      }
    } else {
      for (int64_t c = 0; c < channels; ++c) {
        d[c] = T(0) + math::layernorm_dx(xr[c], m, r, w[c] * widen(g[c]), dnorm_mean, dnorm_norm_mean);
      }
    }
    if constexpr (std::is_same_v<T, float>) {
      if (a.dx_copy16 != nullptr || a.dx_copy != nullptr) {
        store_bf16_row(d, a.dx_copy16 != nullptr ? a.dx_copy16 + n * channels : nullptr,
                       a.dx_copy != nullptr ? a.dx_copy + n * channels : nullptr, channels);
      }
    }
  }
}

template <class T>
[[gnu::flatten]] void layernorm_grad_input_loop(const LayerNormGradLoopArgs<T>& a, int64_t n0, int64_t n1) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.dout16 != nullptr) return layernorm_grad_input_rows(a, a.dout16, n0, n1);
  }
  layernorm_grad_input_rows(a, a.dout, n0, n1);
}

// dw, db: the part owning channels [c0, c1) sums the rows in order.
template <class T, class G>
void layernorm_grad_params_columns(const LayerNormGradLoopArgs<T>& a, const G* dout, int64_t c0, int64_t c1) {
  const int64_t channels = a.channels;
  std::fill(a.dw + c0, a.dw + c1, T(0));
  std::fill(a.db + c0, a.db + c1, T(0));
  for (int64_t n = 0; n < a.rows; ++n) {
    const G* g = dout + n * channels;
    const T* xr = a.x + n * channels;
    const T m = a.mean[n], r = a.rstd[n];
    for (int64_t c = c0; c < c1; ++c) {
      a.dw[c] += widen(g[c]) * ((xr[c] - m) * r);
      a.db[c] += widen(g[c]);
    }
  }
}

template <class T>
[[gnu::flatten]] void layernorm_grad_params_loop(const LayerNormGradLoopArgs<T>& a, int64_t c0, int64_t c1) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.dout16 != nullptr) return layernorm_grad_params_columns(a, a.dout16, c0, c1);
  }
  layernorm_grad_params_columns(a, a.dout, c0, c1);
}

// A (batch, head) pair's q, k and v rows as fp32: where qkv holds bf16
// values, widened once into the thread's scratch, laid out [seq][q | k |
// v] (each element converted once, not at every use); else qkv itself.
struct PairQkv {
  int64_t stride;  // elements between consecutive rows' q
  int64_t offset;  // from a row's q to its k (and k to v)
};

template <class T, class Q>
const T* pair_qkv(const Q* qkv, int64_t b, int64_t h, int64_t seq, int64_t channels, int64_t hd, T* scratch,
                  PairQkv* layout) {
  const int64_t stride = 3 * channels;
  const Q* base = qkv + b * seq * stride + h * hd;  // q of row (b, 0), head h
  if constexpr (std::is_same_v<T, Q>) {
    *layout = PairQkv{stride, channels};
    return base;
  } else {
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t third = 0; third < 3; ++third) {
        const Q* src = base + t * stride + third * channels;
        T* dst = scratch + t * 3 * hd + third * hd;
        for (int64_t j = 0; j < hd; ++j) dst[j] = widen(src[j]);
      }
    }
    *layout = PairQkv{3 * hd, hd};
    return scratch;
  }
}

// Each (batch, head) pair owns its rows of att and its columns of out. Q:
// qkv's element type; an output holding bf16 values is computed in a row of
// the thread's scratch and rounded into place.
template <class T, class Q>
void attention_forward_pairs(const AttentionLoopArgs<T>& a, const Q* qkv, int64_t p0, int64_t p1) {
  const int64_t seq = a.seq, channels = a.channels, heads = a.heads;
  const int64_t hd = channels / heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  bool rounded = false;
  if constexpr (std::is_same_v<T, float>) rounded = a.out16 != nullptr || a.round;
  T* row = nullptr;
  T* widened = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    if (rounded || !std::is_same_v<T, Q>) {
      T* s = thread_floats(ThreadFloats::kLayerLoops, hd + seq * 3 * hd);
      row = s;
      widened = s + hd;
    }
  }
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t b = p / heads, h = p % heads;
    PairQkv l{};
    const T* base = pair_qkv<T>(qkv, b, h, seq, channels, hd, widened, &l);
    for (int64_t t = 0; t < seq; ++t) {
      const T* q = base + t * l.stride;
      T* att = a.att_out + (p * seq + t) * seq;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t t2 = 0; t2 <= t; ++t2) {
        att[t2] = dot(q, base + t2 * l.stride + l.offset, hd) * scale;
        m = std::max(m, att[t2]);
      }
      T sum = 0;
      for (int64_t t2 = 0; t2 <= t; ++t2) {
        att[t2] = std::exp(att[t2] - m);
        sum += att[t2];
      }
      const T inv = T(1) / sum;
      for (int64_t t2 = 0; t2 <= t; ++t2) att[t2] *= inv;
      std::fill(att + t + 1, att + seq, T(0));
      const int64_t at = (b * seq + t) * channels + h * hd;
      T* o = rounded ? row : a.out + at;
      std::fill(o, o + hd, T(0));
      for (int64_t t2 = 0; t2 <= t; ++t2) axpy(att[t2], base + t2 * l.stride + 2 * l.offset, o, hd);
      if constexpr (std::is_same_v<T, float>) {
        if (rounded) {
          store_bf16_row(o, a.out16 != nullptr ? a.out16 + at : nullptr, a.out != nullptr ? a.out + at : nullptr, hd);
        }
      }
    }
  }
}

template <class T>
[[gnu::flatten]] void attention_forward_loop(const AttentionLoopArgs<T>& a, int64_t p0, int64_t p1) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.qkv16 != nullptr) return attention_forward_pairs(a, a.qkv16, p0, p1);
  }
  attention_forward_pairs(a, a.qkv, p0, p1);
}

// Each pair owns its columns of dqkv in its batch's rows. Q, G: qkv's and
// dout's element types (bf16 ones widened once per pair into the thread's
// scratch); a dqkv holding bf16 values is summed in the thread's scratch
// ([seq, 3 head_dim] per pair) and rounded into place at the pair's end.
template <class T, class Q, class G>
void attention_backward_pairs(const AttentionLoopArgs<T>& a, const Q* qkv, const G* dout, int64_t p0, int64_t p1) {
  const int64_t seq = a.seq, channels = a.channels, heads = a.heads;
  const int64_t hd = channels / heads, stride = 3 * channels;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  bool rounded = false;
  if constexpr (std::is_same_v<T, float>) rounded = a.dqkv16 != nullptr || a.round;
  // Where dq, dk and dv are summed: dqkv itself, or the scratch.
  const int64_t dstride = rounded ? 3 * hd : stride, dch = rounded ? hd : channels;
  T* pair_scratch = nullptr;
  T* widened = nullptr;
  T* dout_rows = nullptr;  // the pair's dout rows widened [seq, hd]
  if constexpr (std::is_same_v<T, float>) {
    if (rounded || !std::is_same_v<T, Q> || !std::is_same_v<T, G>) {
      T* s = thread_floats(ThreadFloats::kLayerLoops, 3 * seq * 3 * hd);
      pair_scratch = s;
      widened = s + seq * 3 * hd;
      dout_rows = s + 2 * seq * 3 * hd;
    }
  }
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t b = p / heads, h = p % heads;
    PairQkv l{};
    const T* base = pair_qkv<T>(qkv, b, h, seq, channels, hd, widened, &l);
    // The pair's dout: row t at g_base + t * g_stride.
    const T* g_base = nullptr;
    int64_t g_stride = channels;
    if constexpr (std::is_same_v<T, G>) {
      g_base = dout + b * seq * channels + h * hd;
    } else {
      for (int64_t t = 0; t < seq; ++t) {
        const G* src = dout + (b * seq + t) * channels + h * hd;
        for (int64_t j = 0; j < hd; ++j) dout_rows[t * hd + j] = widen(src[j]);
      }
      g_base = dout_rows;
      g_stride = hd;
    }
    T* dbase = rounded ? pair_scratch : a.dqkv + b * seq * stride + h * hd;
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t third = 0; third < 3; ++third) {
        T* d = dbase + t * dstride + third * dch;
        std::fill(d, d + hd, T(0));
      }
    }
    T* datt = a.scratch + p * seq;
    for (int64_t t = 0; t < seq; ++t) {
      const T* att = a.att + (p * seq + t) * seq;
      const T* g = g_base + t * g_stride;
      const T* q = base + t * l.stride;
      T* dq = dbase + t * dstride;
      for (int64_t t2 = 0; t2 <= t; ++t2) datt[t2] = dot(g, base + t2 * l.stride + 2 * l.offset, hd);
      // Softmax backward: dscore = att (datt - sum att datt).
      const T expected = dot(att, datt, t + 1);
      for (int64_t t2 = 0; t2 <= t; ++t2) {
        const T* k = base + t2 * l.stride + l.offset;
        T* dk = dbase + t2 * dstride + dch;
        T* dv = dbase + t2 * dstride + 2 * dch;
        const T dscore = att[t2] * (datt[t2] - expected) * scale;
        axpy(att[t2], g, dv, hd);
        axpy(dscore, k, dq, hd);
        axpy(dscore, q, dk, hd);
      }
    }
    if constexpr (std::is_same_v<T, float>) {
      if (rounded) {
        for (int64_t t = 0; t < seq; ++t) {
          for (int64_t third = 0; third < 3; ++third) {
            const int64_t at = (b * seq + t) * stride + third * channels + h * hd;
            store_bf16_row(dbase + t * dstride + third * dch, a.dqkv16 != nullptr ? a.dqkv16 + at : nullptr,
                           a.dqkv != nullptr ? a.dqkv + at : nullptr, hd);
          }
        }
      }
    }
  }
}

template <class T>
[[gnu::flatten]] void attention_backward_loop(const AttentionLoopArgs<T>& a, int64_t p0, int64_t p1) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.qkv16 != nullptr && a.dout16 != nullptr) return attention_backward_pairs(a, a.qkv16, a.dout16, p0, p1);
    if (a.qkv16 != nullptr) return attention_backward_pairs(a, a.qkv16, a.dout, p0, p1);
    if (a.dout16 != nullptr) return attention_backward_pairs(a, a.qkv, a.dout16, p0, p1);
  }
  attention_backward_pairs(a, a.qkv, a.dout, p0, p1);
}

[[gnu::flatten]] void round_to_bf16_loop(const float* x, bf16* out, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) out[j] = math::from_f32<bf16>(x[j]);
}

[[gnu::flatten]] void round_through_bf16_loop(const float* x, float* out, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) out[j] = math::round_through_unit<bf16>(x[j]);
}

template <class T>
[[gnu::flatten]] void softmax_xent_loop(const SoftmaxXentLoopArgs<T>& a, int64_t n0, int64_t n1) {
  const int64_t pv = a.padded_vocab;
  for (int64_t n = n0; n < n1; ++n) {
    const T* z = a.logits + n * pv;
    T* dz = a.dlogits + (a.dlogits16 != nullptr ? n0 : n) * pv;
    a.row_loss[n] = softmax_xent_row(z, a.vocab, a.targets[n], a.inv_rows, dz, [](T v) { return math::gpt_exp(v); });
    std::fill(dz + a.vocab, dz + pv, T(0));
    if constexpr (std::is_same_v<T, float>) {
      if (a.storage == DType::kBF16 && a.dlogits16 != nullptr) {
        round_to_bf16_loop(dz, static_cast<bf16*>(a.dlogits16) + n * pv, 0, pv);
      } else if (a.dlogits16 != nullptr) {
        round_through_bf16_loop(dz, static_cast<float*>(a.dlogits16) + n * pv, 0, pv);
      }
    }
  }
}

[[gnu::flatten]] void classifier_loop(const ClassifierLoopArgs& a, float* row, int64_t n0, int64_t n1) {
  const int64_t pv = a.padded_vocab;
  const auto exp = [](float v) { return math::gpt_exp(v); };
  for (int64_t n = n0; n < n1; ++n) {
    if (a.dtype == DType::kF32 && !a.bf16) {
      float* z = static_cast<float*>(a.logits) + n * pv;
      a.row_loss[n] = softmax_xent_row(z, a.vocab, a.targets[n], a.inv_rows, z, exp);
      std::fill(z + a.vocab, z + pv, 0.0f);
      continue;
    }
    if (a.dtype == DType::kBF16) {
      const bf16* src = static_cast<const bf16*>(a.logits) + n * pv;
      for (int64_t j = 0; j < a.vocab; ++j) row[j] = math::to_f32(src[j]);
    } else {
      const float* src = static_cast<const float*>(a.logits) + n * pv;
      std::copy(src, src + a.vocab, row);
    }
    a.row_loss[n] = softmax_xent_row(row, a.vocab, a.targets[n], a.inv_rows, row, exp);
    std::fill(row + a.vocab, row + pv, 0.0f);
    if (a.dtype == DType::kBF16) {
      round_to_bf16_loop(row, static_cast<bf16*>(a.logits) + n * pv, 0, pv);
    } else {
      round_through_bf16_loop(row, static_cast<float*>(a.logits) + n * pv, 0, pv);
    }
  }
}

template <class T>
constexpr LayerLoopsOf<T> make_layer_loops() {
  return LayerLoopsOf<T>{&gelu_forward_loop<T>,          &gelu_backward_loop<T>,
                       &add_loop<T>,                   &bias_grad_loop<T>,
                       &layernorm_forward_loop<T>,     &layernorm_grad_input_loop<T>,
                       &layernorm_grad_params_loop<T>, &attention_forward_loop<T>,
                       &attention_backward_loop<T>,    &softmax_xent_loop<T>,
                       std::is_same_v<T, float> ? &classifier_loop : nullptr,
                       &round_to_bf16_loop,            &round_through_bf16_loop};
}

}  // namespace
}  // namespace mp

// Each layer_loops_<isa>.cc defines MP_GPT_LOOPS_ISA and gets its select function.
#if defined(MP_GPT_LOOPS_ISA)
#define MP_GPT_LOOPS_CAT2(a, b) a##b
#define MP_GPT_LOOPS_CAT(a, b) MP_GPT_LOOPS_CAT2(a, b)
namespace mp::detail {
const LayerLoops& MP_GPT_LOOPS_CAT(select_layer_loops_, MP_GPT_LOOPS_ISA)() {
  static constexpr LayerLoops kLoops = make_layer_loops<float>();
  return kLoops;
}
}  // namespace mp::detail
#endif

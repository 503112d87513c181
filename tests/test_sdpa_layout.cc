// Unit tests of kernels/sdpa_layout.h: the dims and strides the cuDNN
// attention graphs are given (kernels/cuda/attention_cudnn.cc builds them
// from sdpa_layout()) address exactly the elements the CPU attention
// (gpt_attention_forward / _backward in kernels/cpu/attention.h) reads and
// writes: element by element, each buffer covered once, and attention
// computed through the layout equal to the CPU's in float64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/sdpa_layout.h"
#include "tests/gpt_test_ops.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::contains;
using testing::error_of;

// The awkward shapes: B = 1, T = 1, one head and many, head sizes 64 and 128
// and others (cuDNN takes multiples of 8; the layout takes any).
const std::vector<SdpaShape> kShapes = {
    {1, 1, 1, 64}, {1, 12, 1, 64}, {1, 1, 7, 128}, {2, 3, 5, 64},   {3, 2, 17, 128},
    {2, 5, 9, 8},  {1, 4, 33, 80}, {2, 1, 3, 256}, {4, 12, 64, 64}, {2, 7, 130, 3},
};

// The CPU's offsets (Note [GPT op math], gpt_attention_forward): qkv [B T, 3 C],
// row n = b T + t, q | k | v thirds, head h at columns h hs of its third;
// out [B T, C]; lse / stats [B, H, T].
int64_t cpu_qkv(const SdpaShape& s, int which, int64_t b, int64_t h, int64_t t, int64_t d) {
  return (b * s.seq + t) * 3 * s.channels() + which * s.channels() + h * s.head_dim + d;
}
int64_t cpu_out(const SdpaShape& s, int64_t b, int64_t h, int64_t t, int64_t d) {
  return (b * s.seq + t) * s.channels() + h * s.head_dim + d;
}
int64_t cpu_stats(const SdpaShape& s, int64_t b, int64_t h, int64_t t) { return (b * s.heads + h) * s.seq + t; }

// f(b, h, t, d) over every element of s, or 20000 random ones for a large s.
template <class F>
void for_elements(const SdpaShape& s, F f) {
  const int64_t n = s.batch * s.heads * s.seq * s.head_dim;
  if (n <= 200000) {
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t t = 0; t < s.seq; ++t)
          for (int64_t d = 0; d < s.head_dim; ++d) f(b, h, t, d);
    return;
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    f(static_cast<int64_t>(rng() % s.batch), static_cast<int64_t>(rng() % s.heads), static_cast<int64_t>(rng() % s.seq),
      static_cast<int64_t>(rng() % s.head_dim));
  }
}

TEST(SdpaLayout, OffsetsAreTheCpuAttentionsOffsets) {
  for (const SdpaShape& s : kShapes) {
    SCOPED_TRACE(sdpa_shape_name(s));
    const SdpaLayout l = sdpa_layout(s);
    const std::array<int64_t, 4> dims{s.batch, s.heads, s.seq, s.head_dim};
    for (const SdpaTensorLayout* x : {&l.q, &l.k, &l.v, &l.o, &l.d_o, &l.dq, &l.dk, &l.dv}) EXPECT_EQ(x->dims, dims);
    EXPECT_EQ(l.stats.dims, (std::array<int64_t, 4>{s.batch, s.heads, s.seq, 1}));
    int misses = 0;
    for_elements(s, [&](int64_t b, int64_t h, int64_t t, int64_t d) {
      const bool ok =
          l.q.offset(b, h, t, d) == cpu_qkv(s, 0, b, h, t, d) && l.k.offset(b, h, t, d) == cpu_qkv(s, 1, b, h, t, d) &&
          l.v.offset(b, h, t, d) == cpu_qkv(s, 2, b, h, t, d) && l.dq.offset(b, h, t, d) == cpu_qkv(s, 0, b, h, t, d) &&
          l.dk.offset(b, h, t, d) == cpu_qkv(s, 1, b, h, t, d) &&
          l.dv.offset(b, h, t, d) == cpu_qkv(s, 2, b, h, t, d) && l.o.offset(b, h, t, d) == cpu_out(s, b, h, t, d) &&
          l.d_o.offset(b, h, t, d) == cpu_out(s, b, h, t, d) && l.stats.offset(b, h, t, 0) == cpu_stats(s, b, h, t);
      if (!ok && ++misses <= 3) ADD_FAILURE() << "element [" << b << ", " << h << ", " << t << ", " << d << "]";
    });
    EXPECT_EQ(misses, 0);
  }
}

// Every element of qkv is one element of exactly one of Q, K, V (and of
// dqkv of dQ, dK, dV); of out one of O (dout: dO); of stats one of Stats.
TEST(SdpaLayout, ViewsCoverTheirBuffersExactlyOnce) {
  for (const SdpaShape& s : kShapes) {
    if (s.batch * s.seq * 3 * s.channels() > 2000000) continue;
    SCOPED_TRACE(sdpa_shape_name(s));
    const SdpaLayout l = sdpa_layout(s);
    const int64_t rows = s.batch * s.seq;
    const auto hits = [&](std::vector<const SdpaTensorLayout*> views, int64_t size, int64_t last_dim) {
      std::vector<int> n(size);
      for (const SdpaTensorLayout* x : views) {
        for (int64_t b = 0; b < s.batch; ++b)
          for (int64_t h = 0; h < s.heads; ++h)
            for (int64_t t = 0; t < s.seq; ++t)
              for (int64_t d = 0; d < last_dim; ++d) {
                const int64_t i = x->offset(b, h, t, d);
                ASSERT_TRUE(i >= 0 && i < size) << "offset " << i << " outside [0, " << size << ")";
                ++n[i];
              }
      }
      EXPECT_EQ(std::count(n.begin(), n.end(), 1), size) << "elements not hit exactly once";
    };
    hits({&l.q, &l.k, &l.v}, rows * 3 * s.channels(), s.head_dim);
    hits({&l.dq, &l.dk, &l.dv}, rows * 3 * s.channels(), s.head_dim);
    hits({&l.o}, rows * s.channels(), s.head_dim);
    hits({&l.d_o}, rows * s.channels(), s.head_dim);
    hits({&l.stats}, s.batch * s.heads * s.seq, 1);
  }
}

// ---- attention through the layout ------------------------------------------------

// A [B, H, T, D] tensor read through (gather) or written through (scatter) a layout.
std::vector<double> gather(const std::vector<double>& buffer, const SdpaTensorLayout& x) {
  const auto [nb, nh, nt, nd] = x.dims;
  std::vector<double> dense(nb * nh * nt * nd);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t d = 0; d < nd; ++d) dense[((b * nh + h) * nt + t) * nd + d] = buffer.at(x.offset(b, h, t, d));
  return dense;
}
void scatter(const std::vector<double>& dense, const SdpaTensorLayout& x, std::vector<double>& buffer) {
  const auto [nb, nh, nt, nd] = x.dims;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t d = 0; d < nd; ++d) buffer.at(x.offset(b, h, t, d)) = dense[((b * nh + h) * nt + t) * nd + d];
}

// Plain float64 causal attention on dense [B, H, T, D] tensors, as cuDNN's
// graphs define it: o and the row log-sum-exp (forward); dq, dk, dv from do
// (backward: ds = p (dp - rowsum(do o)), scaled by 1 / sqrt(D)).
struct Dense {
  std::vector<double> o, lse, dq, dk, dv;
};
Dense dense_attention(const SdpaShape& s, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, const std::vector<double>& d_o) {
  const int64_t T = s.seq, D = s.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Dense r{std::vector<double>(q.size()), std::vector<double>(s.batch * s.heads * T), std::vector<double>(q.size()),
          std::vector<double>(q.size()), std::vector<double>(q.size())};
  std::vector<double> p(T * T), ds(T * T);
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    const auto row = [&](const std::vector<double>& x, int64_t t) { return x.data() + (bh * T + t) * D; };
    const auto dot = [&](const double* a, const double* b) {
      double sum = 0;
      for (int64_t d = 0; d < D; ++d) sum += a[d] * b[d];
      return sum;
    };
    for (int64_t t = 0; t < T; ++t) {
      double m = -INFINITY;
      for (int64_t u = 0; u <= t; ++u) m = std::max(m, scale * dot(row(q, t), row(k, u)));
      double sum = 0;
      for (int64_t u = 0; u <= t; ++u) sum += std::exp(scale * dot(row(q, t), row(k, u)) - m);
      const double lse = m + std::log(sum);
      r.lse[bh * T + t] = lse;
      for (int64_t u = 0; u < T; ++u) p[t * T + u] = u <= t ? std::exp(scale * dot(row(q, t), row(k, u)) - lse) : 0;
      double* o = r.o.data() + (bh * T + t) * D;
      for (int64_t u = 0; u <= t; ++u)
        for (int64_t d = 0; d < D; ++d) o[d] += p[t * T + u] * row(v, u)[d];
    }
    for (int64_t t = 0; t < T; ++t) {
      const double delta = dot(row(d_o, t), row(r.o, t));
      for (int64_t u = 0; u < T; ++u) ds[t * T + u] = p[t * T + u] * (dot(row(d_o, t), row(v, u)) - delta);
    }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t u = 0; u < T; ++u)
        for (int64_t d = 0; d < D; ++d) {
          r.dq[(bh * T + t) * D + d] += scale * ds[t * T + u] * row(k, u)[d];
          r.dk[(bh * T + u) * D + d] += scale * ds[t * T + u] * row(q, t)[d];
          r.dv[(bh * T + u) * D + d] += p[t * T + u] * row(d_o, t)[d];
        }
  }
  return r;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The layout's views of qkv, out, dout and dqkv, given to attention as
// cuDNN defines it, give the CPU attention's out and dqkv; its Stats are the
// log-sum-exp of the CPU's probabilities (p = exp(score - lse)).
TEST(SdpaLayout, AttentionThroughTheLayoutIsTheCpuAttention) {
  for (const SdpaShape& s : {SdpaShape{1, 1, 1, 8}, SdpaShape{2, 3, 5, 16}, SdpaShape{1, 2, 9, 64},
                             SdpaShape{2, 4, 17, 24}, SdpaShape{1, 1, 12, 128}}) {
    SCOPED_TRACE(sdpa_shape_name(s));
    const int64_t rows = s.batch * s.seq, c = s.channels();
    std::mt19937_64 rng(11);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> qkv(rows * 3 * c), dout(rows * c);
    for (double& x : qkv) x = normal(rng);
    for (double& x : dout) x = normal(rng);

    std::vector<double> att(s.batch * s.heads * s.seq * s.seq), out(rows * c), dqkv(rows * 3 * c),
        scratch(s.batch * s.heads * s.seq);
    gpt_attention_forward(qkv.data(), s.batch, s.seq, c, s.heads, att.data(), out.data(), 1);
    gpt_attention_backward(qkv.data(), att.data(), dout.data(), s.batch, s.seq, c, s.heads, scratch.data(), dqkv.data(),
                           1);

    const SdpaLayout l = sdpa_layout(s);
    const Dense r = dense_attention(s, gather(qkv, l.q), gather(qkv, l.k), gather(qkv, l.v), gather(dout, l.d_o));
    std::vector<double> out_l(rows * c, NAN), dqkv_l(rows * 3 * c, NAN), stats(s.batch * s.heads * s.seq, NAN);
    scatter(r.o, l.o, out_l);
    scatter(r.dq, l.dq, dqkv_l);
    scatter(r.dk, l.dk, dqkv_l);
    scatter(r.dv, l.dv, dqkv_l);
    scatter(r.lse, l.stats, stats);
    EXPECT_LE(max_abs_diff(out_l, out), 1e-12);  // also NaN-free: every element written
    EXPECT_LE(max_abs_diff(dqkv_l, dqkv), 1e-11);

    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    double worst = 0;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t t = 0; t < s.seq; ++t)
          for (int64_t u = 0; u <= t; ++u) {
            double score = 0;
            for (int64_t d = 0; d < s.head_dim; ++d)
              score += qkv[cpu_qkv(s, 0, b, h, t, d)] * qkv[cpu_qkv(s, 1, b, h, u, d)];
            const double p = std::exp(scale * score - stats[l.stats.offset(b, h, t, 0)]);
            worst = std::max(worst, std::fabs(p - att[((b * s.heads + h) * s.seq + t) * s.seq + u]));
          }
    EXPECT_LE(worst, 1e-12) << "probabilities from Stats against the CPU's";
  }
}

TEST(SdpaLayout, RefusesEmptyShapes) {
  for (const SdpaShape& s : {SdpaShape{0, 1, 1, 8}, SdpaShape{1, 0, 1, 8}, SdpaShape{1, 1, 0, 8}, SdpaShape{1, 1, 1, 0},
                             SdpaShape{-1, 1, 1, 8}}) {
    const std::string msg = error_of<EnforceError>([&] { sdpa_layout(s); });
    EXPECT_TRUE(contains(msg, sdpa_shape_name(s)) && contains(msg, "every size must be positive")) << msg;
  }
  EXPECT_EQ(sdpa_shape_name({4, 12, 1024, 64}), "(B=4, H=12, T=1024, hs=64)");
}

}  // namespace
}  // namespace mp

// tests/muon_reference.h: float64 references for Muon (optim/muon.h) and its
// Newton-Schulz iteration (kernels/cpu/newton_schulz.h), a rounding-error
// model of the iteration that gives the tests their tolerances, and singular
// values by Jacobi's method. Plain loops, written from torch's formulas, not
// from the library's code.
//
// Note [Newton-Schulz tolerances]
// What is compared: rho = ||X - Y||_F / ||Y||_F, X the library's result, Y
// the float64 reference's.
//
// A worst-case bound is of no use here. The iteration X' = a X + (b A + c
// A^2) X, A = X X^T, subtracts terms of similar size: at a singular value
// s, |a| s + |b| s^3 + |c| s^5 exceeds p(s) = a s + b s^3 + c s^5 by up to
// 18.6x (s^2 = 1.175, where p(s) / s is smallest, 0.638), so a relative
// error u in each of the 3 roundings of an iteration can give 3 x 18.6 u in
// X'; a perturbation of the iterate can grow by max |p'| = 3.97 (on [0,
// 1.21], the interval the singular values stay in) per iteration. For bf16
// (u = 2^-8) that bounds rho by more than 1 after one iteration, for fp32 by
// about 1e-2, while both errors are a hundred times smaller.
//
// So the tolerance comes from a statistical model of the rounding errors,
// evaluated on the float64 reference (ns_reference with a NsNoise):
// - every rounding of a value v to a format of p bits (fp32 24, bf16 8) is
//   an error uniform in +-(half an ulp of v): relative size <= 2^-p (the
//   unit roundoff: 2^-24, 2^-8), standard deviation ulp/(2 sqrt 3);
// - an fp32 dot product of length k (the GEMMs: k = n for X X^T, k = m for
//   A A and B X) adds k such roundings of partial sums bounded by
//   sum |a_l b_l|: an error of standard deviation at most
//   2^-24 / sqrt(3) x sqrt(k) x (|A| |B|)_ij, drawn here as a Gaussian (the
//   sum of k independent terms). It overestimates: oneDNN's blocked sums
//   have smaller partial sums;
// - the roundings the library does are placed where it rounds: the input
//   to the iteration dtype, the fp32 norm and its rounding, the division,
//   each GEMM's accumulation and (bf16) result, the fp32 products and sum
//   of each combination, and each combination's rounding (bf16).
// All of them at once, independently drawn, to first order add up to an
// error whose expected square norm is the sum of each one's contribution
// carried through the remaining iterations: one run of the reference with
// the noise is a sample of the model's error. The samples concentrate (3
// draws agree within 10%), and the model's prediction matched torch's own
// bf16 iteration (torch 2.15, CPU) within 0.85x to 1.05x on the shapes
// tested here and overestimated its fp32 one by 4x. The tolerance is twice
// the root mean square of two samples (kNoiseMargin): the error exceeds it
// only if the library rounds more often, in a coarser dtype or at other
// points than modelled.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/newton_schulz.h"
#include "optim/muon.h"
#include "tests/test_util.h"

namespace mp::testing {

inline constexpr double kNoiseMargin = 2.0;

// Row-major [r, k] x [k, c].
inline std::vector<double> ref_matmul(const std::vector<double>& x, const std::vector<double>& y, int64_t r, int64_t k,
                                      int64_t c) {
  std::vector<double> out(static_cast<size_t>(r * c), 0.0);
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t l = 0; l < k; ++l) {
      const double xil = x[i * k + l];
      for (int64_t j = 0; j < c; ++j) out[i * c + j] += xil * y[l * c + j];
    }
  }
  return out;
}

inline std::vector<double> ref_transpose(const std::vector<double>& x, int64_t r, int64_t c) {
  std::vector<double> out(x.size());
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < c; ++j) out[j * r + i] = x[i * c + j];
  }
  return out;
}

inline double ref_norm(const std::vector<double>& x) {
  double s = 0.0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

inline double ref_distance(const std::vector<double>& x, const std::vector<double>& y) {
  double s = 0.0;
  for (size_t i = 0; i < x.size(); ++i) s += (x[i] - y[i]) * (x[i] - y[i]);
  return std::sqrt(s);
}

// The rounding-error model of Note [Newton-Schulz tolerances]: bits is the
// iteration dtype's precision (24 fp32, 8 bf16).
struct NsNoise {
  int bits = 24;
  std::mt19937_64 rng{12345};
  // Optional: a bound on each input element's own error (the momentum's
  // fp32 arithmetic, Note [Muon step tolerances]), drawn uniform within it.
  std::vector<double> input_error;

  // v plus a uniform error within half an ulp of v at p bits.
  double round(double v, int p) {
    if (v == 0.0 || !std::isfinite(v)) return v;
    const double half_ulp = std::ldexp(1.0, std::ilogb(v) - p);
    return v + std::uniform_real_distribution<double>(-half_ulp, half_ulp)(rng);
  }
  double round32(double v) { return round(v, 24); }
  // The rounding to the iteration dtype after an fp32 result: a second one for bf16 only.
  double round_s(double v) { return bits == 24 ? v : round(v, bits); }
  // C = X Y plus the accumulation error of an fp32 dot product of length k.
  std::vector<double> matmul(const std::vector<double>& x, const std::vector<double>& y, int64_t r, int64_t k,
                             int64_t c) {
    std::vector<double> out = ref_matmul(x, y, r, k, c), ax(x.size()), ay(y.size());
    for (size_t i = 0; i < x.size(); ++i) ax[i] = std::fabs(x[i]);
    for (size_t i = 0; i < y.size(); ++i) ay[i] = std::fabs(y[i]);
    const std::vector<double> bound = ref_matmul(ax, ay, r, k, c);
    const double scale = std::ldexp(1.0, -24) / std::sqrt(3.0) * std::sqrt(static_cast<double>(k));
    std::normal_distribution<double> normal(0.0, 1.0);
    for (size_t i = 0; i < out.size(); ++i) out[i] += normal(rng) * scale * bound[i];
    return out;
  }
};

// Note [Newton-Schulz iteration] in float64 (noise null), or with the
// model's rounding errors: g row-major [rows, cols].
inline std::vector<double> ns_reference(const std::vector<double>& g, int64_t rows, int64_t cols,
                                        const NewtonSchulzOptions& o, NsNoise* noise = nullptr) {
  const bool transposed = rows > cols;
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  std::vector<double> x = transposed ? ref_transpose(g, rows, cols) : g;
  auto r32 = [&](double v) { return noise ? noise->round32(v) : v; };
  auto rs = [&](double v) { return noise ? noise->round_s(v) : v; };
  auto product = [&](const std::vector<double>& p, const std::vector<double>& q, int64_t r, int64_t k, int64_t c) {
    return noise ? noise->matmul(p, q, r, k, c) : ref_matmul(p, q, r, k, c);
  };
  if (noise != nullptr && !noise->input_error.empty()) {  // errors the input carries (transposed with it)
    const std::vector<double> e = transposed ? ref_transpose(noise->input_error, rows, cols) : noise->input_error;
    for (size_t i = 0; i < x.size(); ++i) x[i] += std::uniform_real_distribution<double>(-e[i], e[i])(noise->rng);
  }
  for (double& v : x) v = rs(v);  // the fp32 input to the iteration dtype
  const double d = std::max(rs(r32(ref_norm(x))), rs(r32(o.eps)));
  for (double& v : x) v = rs(r32(v / d));
  for (int step = 0; step < o.steps; ++step) {
    std::vector<double> a = product(x, ref_transpose(x, m, n), m, n, m);
    for (double& v : a) v = rs(v);
    const std::vector<double> p = product(a, a, m, m, m);
    std::vector<double> b(a.size());
    for (size_t i = 0; i < b.size(); ++i) b[i] = rs(r32(r32(o.b * a[i]) + r32(o.c * p[i])));
    const std::vector<double> q = product(b, x, m, m, n);
    for (size_t i = 0; i < x.size(); ++i) x[i] = rs(r32(r32(o.a * x[i]) + q[i]));
  }
  return transposed ? ref_transpose(x, m, n) : x;
}

// The tolerance on rho for the library's NS of g (Note [Newton-Schulz
// tolerances]): kNoiseMargin x the model's root-mean-square relative error
// over two draws.
inline double ns_tolerance(const std::vector<double>& g, int64_t rows, int64_t cols, const NewtonSchulzOptions& o,
                           uint64_t seed = 1, const std::vector<double>& input_error = {}) {
  const std::vector<double> y = ns_reference(g, rows, cols, o);
  double sum_sq = 0.0;
  for (int draw = 0; draw < 2; ++draw) {
    NsNoise noise{o.dtype == DType::kBF16 ? 8 : 24, std::mt19937_64(seed * 7919 + static_cast<uint64_t>(draw)),
                  input_error};
    const double rho = ref_distance(ns_reference(g, rows, cols, o, &noise), y) / ref_norm(y);
    sum_sq += rho * rho;
  }
  return kNoiseMargin * std::sqrt(sum_sq / 2.0);
}

// The eigenvalues of a symmetric [n, n] matrix, ascending: cyclic Jacobi.
inline std::vector<double> ref_symmetric_eigenvalues(std::vector<double> s, int64_t n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0.0, total = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) (i == j ? total : off) += s[i * n + j] * s[i * n + j];
    }
    if (off <= 1e-30 * (total + off)) break;
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t q = p + 1; q < n; ++q) {
        const double apq = s[p * n + q];
        if (apq == 0.0) continue;
        const double theta = (s[q * n + q] - s[p * n + p]) / (2.0 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), sn = t * c;
        for (int64_t k = 0; k < n; ++k) {  // columns p, q
          const double skp = s[k * n + p], skq = s[k * n + q];
          s[k * n + p] = c * skp - sn * skq;
          s[k * n + q] = sn * skp + c * skq;
        }
        for (int64_t k = 0; k < n; ++k) {  // rows p, q
          const double spk = s[p * n + k], sqk = s[q * n + k];
          s[p * n + k] = c * spk - sn * sqk;
          s[q * n + k] = sn * spk + c * sqk;
        }
      }
    }
  }
  std::vector<double> eig(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) eig[static_cast<size_t>(i)] = s[i * n + i];
  std::sort(eig.begin(), eig.end());
  return eig;
}

// The min(rows, cols) singular values of x [rows, cols], ascending (from
// the smaller Gram matrix; fine for the well-conditioned results here).
inline std::vector<double> ref_singular_values(const std::vector<double>& x, int64_t rows, int64_t cols) {
  const bool wide = rows <= cols;
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  const std::vector<double> w = wide ? x : ref_transpose(x, rows, cols);  // [m, n]
  std::vector<double> gram = ref_matmul(w, ref_transpose(w, m, n), m, n, m);
  std::vector<double> eig = ref_symmetric_eigenvalues(std::move(gram), m);
  for (double& e : eig) e = std::sqrt(std::max(e, 0.0));
  return eig;
}

// Note [Muon step tolerances]
// muon_reference_run runs Note [Muon step] in float64 and bounds how far the
// library's fp32 step may be from it, per step t, with u = 2^-24:
// - momentum: each lerp(s, e, w) rounds e - s, the fma and the weight, which
//   costs at most u (|e| + |s| + |result|) per element and carries the
//   error of s with factor 1 - w <= 1 (both of torch's branches), so
//   ||dM_t|| <= ||dM_t-1|| + u (||G_t|| + ||M_t-1|| + ||M_t||) (Frobenius);
//   the same per element bounds what the Newton-Schulz input U_t carries
//   (plus the Nesterov lerp's own u (|G| + |M| + |U|)), which enters the
//   iteration's noise model as an input error (NsNoise::input_error);
// - NS: ||dO_t|| <= tol_t ||O_t||, tol_t = ns_tolerance on the reference U_t
//   (Note [Newton-Schulz tolerances]);
// - param: P_t = fma(O_t, -adjusted, P_t-1 (1 - lr wd)) rounds the decay
//   factor, the product and the fma, and alpha: ||dP_t|| <= ||dP_t-1|| +
//   adjusted ||dO_t|| + u (2 ||P_t-1|| + ||P_t|| + adjusted ||O_t||).
struct MuonReferenceRun {
  std::vector<double> param, momentum;
  double param_bound = 0.0, momentum_bound = 0.0;  // Frobenius
};

inline double ref_adjusted_ratio(MuonAdjustLr fn, int64_t lr_a, int64_t lr_b) {
  const double a = static_cast<double>(lr_a), b = static_cast<double>(lr_b);
  switch (fn) {
    case MuonAdjustLr::kOriginal: return std::sqrt(std::max(1.0, a / b));
    case MuonAdjustLr::kMatchRmsAdamW: return 0.2 * std::sqrt(std::max(a, b));
    case MuonAdjustLr::kSpectralUnclamped: return std::sqrt(a / b);
  }
  return 0.0;
}

// grads.size() steps from param (momentum zeros), (lr_a, lr_b) the shape
// adjust_lr_fn reads.
inline MuonReferenceRun muon_reference_run(const MuonHyper& h, int64_t rows, int64_t cols, int64_t lr_a, int64_t lr_b,
                                           const std::vector<double>& param,
                                           const std::vector<std::vector<double>>& grads, double lr,
                                           double weight_decay) {
  const double u = std::ldexp(1.0, -24);
  MuonReferenceRun r;
  r.param = param;
  r.momentum.assign(param.size(), 0.0);
  std::vector<double> carried(param.size(), 0.0);  // per element: the momentum's error bound
  NewtonSchulzOptions o;
  o.a = h.ns_a;
  o.b = h.ns_b;
  o.c = h.ns_c;
  o.steps = h.ns_steps;
  o.eps = h.eps;
  o.dtype = h.iteration_dtype;
  const double adjusted = lr * ref_adjusted_ratio(h.adjust_lr, lr_a, lr_b);
  for (size_t t = 0; t < grads.size(); ++t) {
    const std::vector<double>& g = grads[t];
    const std::vector<double> m_before = r.momentum;
    std::vector<double> x(g.size()), input_error(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      const double m = m_before[i] + (1.0 - h.momentum) * (g[i] - m_before[i]);
      carried[i] += u * (std::fabs(g[i]) + std::fabs(m_before[i]) + std::fabs(m));
      r.momentum[i] = m;
      x[i] = h.nesterov ? g[i] + h.momentum * (m - g[i]) : m;
      input_error[i] = h.nesterov ? h.momentum * carried[i] + u * (std::fabs(g[i]) + std::fabs(m) + std::fabs(x[i]))
                                  : carried[i];
    }
    r.momentum_bound += u * (ref_norm(g) + ref_norm(m_before) + ref_norm(r.momentum));
    const std::vector<double> update = ns_reference(x, rows, cols, o);
    const double tol = ns_tolerance(x, rows, cols, o, t + 1, input_error);
    const double p_before = ref_norm(r.param);
    for (size_t i = 0; i < r.param.size(); ++i) r.param[i] = r.param[i] * (1.0 - lr * weight_decay) - adjusted * update[i];
    const double o_norm = ref_norm(update);
    r.param_bound += adjusted * tol * o_norm + u * (2.0 * p_before + ref_norm(r.param) + adjusted * o_norm);
  }
  return r;
}


}  // namespace mp::testing

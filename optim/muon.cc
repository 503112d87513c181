#include "optim/muon.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/newton_schulz.h"

namespace mp {
namespace {

// The element passes' parts start at multiples of 16 elements (64 bytes).
// Every element is computed alone, so the split changes no bit.
constexpr int64_t kAlign = 16;

}  // namespace

NewtonSchulzOptions muon_ns_options(const MuonHyper& h, int threads) {
  NewtonSchulzOptions o;
  o.a = h.ns_a;
  o.b = h.ns_b;
  o.c = h.ns_c;
  o.steps = h.ns_steps;
  o.eps = h.eps;
  o.dtype = h.iteration_dtype;
  o.threads = threads;
  return o;
}

namespace {

int64_t update_floats(int64_t rows, int64_t cols) { return (rows * cols + 15) / 16 * 16; }

}  // namespace

double muon_adjusted_lr(double lr, MuonAdjustLr fn, int64_t a, int64_t b) {
  MP_ENFORCE(a > 0 && b > 0, "muon: adjusted lr of a [", a, ", ", b, "] matrix");
  const double da = static_cast<double>(a), db = static_cast<double>(b);
  switch (fn) {
    case MuonAdjustLr::kOriginal: return lr * std::sqrt(std::max(1.0, da / db));
    case MuonAdjustLr::kMatchRmsAdamW: return lr * (0.2 * std::sqrt(std::max(da, db)));
    case MuonAdjustLr::kSpectralUnclamped: return lr * std::sqrt(da / db);
  }
  MP_THROW(EnforceError, "muon: unknown adjust_lr_fn ", static_cast<int>(fn));
}

int64_t muon_scratch_elements(int64_t rows, int64_t cols, const MuonHyper& hyper) {
  return update_floats(rows, cols) + newton_schulz_scratch_elements(rows, cols, muon_ns_options(hyper, 0));
}

int64_t muon_owner_scratch_elements(int64_t rows, int64_t cols, const MuonHyper& hyper) {
  return newton_schulz_scratch_elements(rows, cols, muon_ns_options(hyper, 0));
}

MuonMomentum muon_momentum_constants(const MuonHyper& h) {
  MuonMomentum c;
  c.w_buf = static_cast<float>(1.0 - h.momentum);
  c.w_nesterov = static_cast<float>(h.momentum);
  c.nesterov = h.nesterov;
  return c;
}

void muon_orthogonalize_cpu(const MuonHyper& h, const float* u, int64_t rows, int64_t cols, float* o, int threads,
                            float* scratch, int64_t scratch_elements) {
  newton_schulz_cpu(u, o, rows, cols, muon_ns_options(h, threads), scratch, scratch_elements);
}

MuonApply muon_apply_constants(const MuonHyper& h, double lr, double weight_decay, int64_t lr_a, int64_t lr_b) {
  MuonApply c;
  c.alpha = static_cast<float>(-muon_adjusted_lr(lr, h.adjust_lr, lr_a, lr_b));
  c.decay = static_cast<float>(1.0 - lr * weight_decay);
  return c;
}

void muon_apply_cpu(float* param, const float* update, int64_t n, const MuonApply& c, int threads) {
  parallel_for(n, threads, kAlign, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) param[i] = muon_apply_element(param[i], update[i], c);
  });
}

void muon_step_cpu(const MuonHyper& h, const MuonMatrix& x, const MuonStep& s) {
  MP_ENFORCE(x.rows > 0 && x.cols > 0, "muon step: a [", x.rows, ", ", x.cols, "] matrix");
  MP_ENFORCE(x.param != nullptr && x.momentum != nullptr && x.grad != nullptr, "muon step: null array");
  MP_ENFORCE((x.lr_a > 0) == (x.lr_b > 0), "muon step: lr shape (", x.lr_a, ", ", x.lr_b, "): both or neither");
  const int64_t need = muon_scratch_elements(x.rows, x.cols, h);
  float* scratch = s.scratch;
  if (scratch == nullptr) {
    thread_local std::vector<float> buffer;
    if (static_cast<int64_t>(buffer.size()) < need) buffer.resize(static_cast<size_t>(need));
    scratch = buffer.data();
  } else {
    MP_ENFORCE(s.scratch_elements >= need, "muon step: scratch of ", s.scratch_elements, " floats for a [", x.rows,
               ", ", x.cols, "] matrix, needs ", need);
  }
  float* update = scratch;
  float* ns_scratch = scratch + update_floats(x.rows, x.cols);
  const int64_t ns_elements = need - update_floats(x.rows, x.cols);
  // U, into `update`.
  const MuonMomentum mc = muon_momentum_constants(h);
  const float mult = s.grad_multiplier;
  parallel_for(x.rows * x.cols, s.threads, kAlign, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      update[i] = muon_momentum_element(x.momentum[i], mult == 1.0f ? x.grad[i] : x.grad[i] * mult, mc);
    }
  });
  // O = NS(U), in `update`.
  muon_orthogonalize_cpu(h, update, x.rows, x.cols, update, s.threads, ns_scratch, ns_elements);
  const MuonApply c = muon_apply_constants(h, s.lr, s.weight_decay, x.lr_a > 0 ? x.lr_a : x.rows,
                                           x.lr_b > 0 ? x.lr_b : x.cols);
  muon_apply_cpu(x.param, update, x.rows * x.cols, c, s.threads);
}

double muon_ns_flops(int64_t rows, int64_t cols, int ns_steps) {
  const double m = static_cast<double>(std::min(rows, cols)), n = static_cast<double>(std::max(rows, cols));
  return static_cast<double>(ns_steps) * (4.0 * m * m * n + 2.0 * m * m * m);
}

std::vector<int> assign_muon_owners(const std::vector<double>& flops, int ranks) {
  MP_ENFORCE(ranks >= 1, "muon owners over ", ranks, " ranks");
  std::vector<size_t> order(flops.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return flops[a] > flops[b]; });
  std::vector<double> load(static_cast<size_t>(ranks), 0.0);
  std::vector<int> owners(flops.size(), 0);
  for (const size_t i : order) {
    const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owners[i] = static_cast<int>(r);
    load[r] += flops[i];
  }
  return owners;
}

}  // namespace mp

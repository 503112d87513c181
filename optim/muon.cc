#include "optim/muon.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/newton_schulz.h"

namespace mp {
namespace {

// The element passes' parts start at multiples of 16 elements (64 bytes).
// Every element is computed alone, so the split changes no bit.
constexpr int64_t kAlign = 16;

// ATen's lerp on the CPU (aten/src/ATen/native/Lerp.h, lerp_vec):
// start + w (end - start) for |w| < 0.5, else end - (1 - w)(end - start),
// each as one fma.
inline float torch_lerp(float start, float end, float w) {
  const float diff = end - start;
  return std::fabs(w) < 0.5f ? std::fma(w, diff, start) : std::fma(w - 1.0f, diff, end);
}

NewtonSchulzOptions ns_options(const MuonHyper& h, int threads) {
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
  return update_floats(rows, cols) + newton_schulz_scratch_elements(rows, cols, ns_options(hyper, 0));
}

void muon_step_cpu(const MuonHyper& h, const MuonMatrix& x, const MuonStep& s) {
  MP_ENFORCE(x.rows > 0 && x.cols > 0, "muon step: a [", x.rows, ", ", x.cols, "] matrix");
  MP_ENFORCE(x.param != nullptr && x.momentum != nullptr && x.grad != nullptr, "muon step: null array");
  MP_ENFORCE((x.lr_a > 0) == (x.lr_b > 0), "muon step: lr shape (", x.lr_a, ", ", x.lr_b, "): both or neither");
  const int64_t n = x.rows * x.cols;
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

  // The momentum buffer, and U (Nesterov: into `update`).
  const float w_buf = static_cast<float>(1.0 - h.momentum);
  const float w_nesterov = static_cast<float>(h.momentum);
  const float mult = s.grad_multiplier;
  parallel_for(n, s.threads, kAlign, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float g = mult == 1.0f ? x.grad[i] : x.grad[i] * mult;
      const float m = torch_lerp(x.momentum[i], g, w_buf);
      x.momentum[i] = m;
      if (h.nesterov) update[i] = torch_lerp(g, m, w_nesterov);
    }
  });

  // O = NS(U), in `update`.
  newton_schulz_cpu(h.nesterov ? update : x.momentum, update, x.rows, x.cols, ns_options(h, s.threads), ns_scratch,
                    ns_elements);

  // P = fma(O, -adjusted_lr, P (1 - lr wd)).
  const double adjusted =
      muon_adjusted_lr(s.lr, h.adjust_lr, x.lr_a > 0 ? x.lr_a : x.rows, x.lr_b > 0 ? x.lr_b : x.cols);
  const float alpha = static_cast<float>(-adjusted);
  const float decay = static_cast<float>(1.0 - s.lr * s.weight_decay);
  parallel_for(n, s.threads, kAlign, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x.param[i] = std::fma(update[i], alpha, x.param[i] * decay);
  });
}

MuonAssignment gpt_muon_assignment(const std::string& name, const Shape& shape) {
  static const std::regex in_block(R"(h[0-9]+\..+)");
  MuonAssignment a;
  if (shape.size() != 2 || !std::regex_match(name, in_block)) return a;
  a.muon = true;
  a.lr_a = shape[1];  // out (fan-out): the GPT stores [in, out]
  a.lr_b = shape[0];
  return a;
}

}  // namespace mp

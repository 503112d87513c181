// The fused optimizer step (kernels/cpu/update.h) against a plain float64
// reference: one step from the same state; 1000-step trajectories for every
// (optimizer, grad dtype, master mode, moment dtype, rounding) combination;
// bf16_remainder bitwise equal to the fp32 master; pure low precision with
// stochastic rounding unbiased; found_inf; the per-range table; argument
// errors. The vector variants: tests/test_update_variants.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/update.h"
#include "tests/update_test_util.h"

namespace mp {
namespace {

using testing::Array;
using testing::hyper_for;

// ---- float64 reference, written plainly from the torch formulas ----------

struct Ref {
  double p = 0, m = 0, v = 0;
};

struct RefStep {
  double lr, beta1, beta2, eps, wd, momentum, dampening;
  bool nesterov;
  int64_t t;
};

RefStep ref_step(const OptimizerHyper& h, double lr, int64_t t) {
  return RefStep{lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.momentum, h.dampening, h.nesterov, t};
}

void ref_update(UpdateRule kind, Ref& r, double g, const RefStep& s) {
  switch (kind) {
    case UpdateRule::kAdamW: {
      const double bc1 = 1 - std::pow(s.beta1, static_cast<double>(s.t));
      const double bc2 = 1 - std::pow(s.beta2, static_cast<double>(s.t));
      r.p *= 1 - s.lr * s.wd;
      r.m = s.beta1 * r.m + (1 - s.beta1) * g;
      r.v = s.beta2 * r.v + (1 - s.beta2) * g * g;
      r.p -= s.lr / bc1 * r.m / (std::sqrt(r.v) / std::sqrt(bc2) + s.eps);
      break;
    }
    case UpdateRule::kSgd:
    case UpdateRule::kSgdMomentum: {
      g += s.wd * r.p;
      double d = g;
      if (s.momentum != 0) {
        r.m = s.t == 1 ? g : s.momentum * r.m + (1 - s.dampening) * g;
        d = s.nesterov ? g + s.momentum * r.m : r.m;
      }
      r.p -= s.lr * d;
      break;
    }
    case UpdateRule::kLion: {
      r.p *= 1 - s.lr * s.wd;
      const double c = s.beta1 * r.m + (1 - s.beta1) * g;
      r.p -= s.lr * (c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0);
      r.m = s.beta2 * r.m + (1 - s.beta2) * g;
      break;
    }
  }
}

float lr_for(UpdateRule kind) {
  return kind == UpdateRule::kLion ? 1e-4f : 1e-3f;
}

const char* kind_name(UpdateRule k) {
  switch (k) {
    case UpdateRule::kAdamW: return "adamw";
    case UpdateRule::kSgd: return "sgd";
    case UpdateRule::kSgdMomentum: return "sgd_momentum";
    case UpdateRule::kLion: return "lion";
  }
  return "?";
}

// ---- storage ----------------------------------------------------------------

// One shard in one configuration.
struct Shard {
  int64_t n;
  MasterMode mode;
  std::vector<float> master;
  std::vector<int16_t> remainder;
  Array s0, s1, out;

  Shard(int64_t n_, MasterMode mode_, DType state, DType param, const std::vector<float>& init)
      : n(n_), mode(mode_), s0(state, n_), s1(state, n_), out(param, n_) {
    if (mode == MasterMode::kFp32) master = init;
    if (mode == MasterMode::kBf16Remainder) {
      remainder.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        const auto split = math::split_bf16_remainder(init[i]);
        std::memcpy(out.bytes.data() + 2 * i, &split.h, 2);
        remainder[i] = split.r;
      }
    }
    if (mode == MasterMode::kNone) {
      for (int64_t i = 0; i < n; ++i) out.set(i, init[i]);
    }
  }

  float param(int64_t i) const {
    if (mode == MasterMode::kFp32) return master[i];
    if (mode == MasterMode::kBf16Remainder) {
      uint16_t h;
      std::memcpy(&h, out.bytes.data() + 2 * i, 2);
      return math::merge_bf16_remainder(h, remainder[i]);
    }
    return out.get(i);
  }

  UpdateArgs args(const OptimizerHyper& h, const Array& grad, Rounding rounding) {
    UpdateArgs a;
    a.hyper = h;
    a.n = n;
    a.master_mode = mode;
    a.master = master.empty() ? nullptr : master.data();
    a.master_remainder = remainder.empty() ? nullptr : remainder.data();
    a.state0 = s0.data();
    a.state1 = h.rule == UpdateRule::kAdamW ? s1.data() : nullptr;
    a.state_dtype = s0.dtype;
    a.grad = grad.bytes.data();
    a.grad_dtype = grad.dtype;
    a.param_out = out.data();
    a.param_dtype = out.dtype;
    a.rounding = rounding;
    a.seed = 99;
    return a;
  }
};

std::vector<float> initial_params(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> p(n);
  for (auto& x : p) x = normal(rng);
  return p;
}

// Gradients in `dtype`; their exact values are what the reference sees.
Array gradients(DType dtype, int64_t n, int64_t t) {
  std::mt19937_64 rng(1000 + static_cast<uint64_t>(t));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Array g(dtype, n);
  for (int64_t i = 0; i < n; ++i) g.set(i, normal(rng) * static_cast<float>(1 + t % 7));
  return g;
}

// ---- one step ---------------------------------------------------------------

// One step from the same state: the fp32 kernel is within a few fp32 ulps of
// the float64 reference started from the same (fp32) values.
TEST(FusedUpdate, OneStepMatchesFloat64ToFloatRounding) {
  const int64_t n = 4096;
  for (UpdateRule kind : testing::all_rules()) {
    const OptimizerHyper h = hyper_for(kind);
    Shard s(n, MasterMode::kFp32, DType::kF32, DType::kBF16, initial_params(n, 3));
    for (int t = 1; t <= 5; ++t) {
      const Array g = gradients(DType::kF32, n, t);
      std::vector<Ref> ref(n);
      for (int64_t i = 0; i < n; ++i) ref[i] = Ref{s.master[i], s.s0.get(i), s.s1.get(i)};
      const std::vector<float> before = s.master;
      std::vector<float> m_before(n);
      for (int64_t i = 0; i < n; ++i) m_before[i] = s.s0.get(i);
      StepScalars sc;
      sc.lr = lr_for(kind);
      sc.step = t;
      fused_update_cpu(s.args(h, g, Rounding::kNearestEven), sc);
      const float bc1 = math::step_constants<math::AdamW>(h, sc, 1, 1).bias_correction1;
      for (int64_t i = 0; i < n; ++i) {
        ref_update(kind, ref[i], g.get(i), ref_step(h, sc.lr, t));
        // A handful of fp32 roundings at the scale of |p|, of the update, and
        // of the terms that may cancel inside it (g and the moments, times
        // the effective learning rate).
        const double p_old = before[i];
        const double lr = kind == UpdateRule::kAdamW ? sc.lr / bc1 : sc.lr;
        const double terms = std::fabs(g.get(i)) + std::fabs(m_before[i]) + std::fabs(ref[i].m);
        const double tol = 16 * 0x1p-24 * (std::fabs(p_old) + std::fabs(ref[i].p - p_old) + lr * terms);
        ASSERT_NEAR(s.master[i], ref[i].p, tol) << kind_name(kind) << " step " << t << " i " << i;
        // m + (1 - b1)(g - m) rounds at the scale of g, not of the (small) result.
        ASSERT_NEAR(s.s0.get(i), ref[i].m, 8 * 0x1p-24 * (std::fabs(ref[i].m) + std::fabs(g.get(i))));
        uint16_t copy;
        std::memcpy(&copy, s.out.bytes.data() + 2 * i, 2);
        ASSERT_EQ(copy, math::f32_to_bf16_bits(s.master[i])) << "the copy is the master rounded once";
      }
    }
  }
}

// ---- 1000-step trajectories of every combination ---------------------------

struct MatrixCase {
  UpdateRule kind;
  DType grad;
  DType state;
  Rounding rounding;
};

std::string describe(const MatrixCase& c) {
  return std::string(kind_name(c.kind)) + " grad " + std::string(dtype_name(c.grad)) + " state " +
         std::string(dtype_name(c.state)) + (c.rounding == Rounding::kStochastic ? " stochastic" : " nearest");
}

// Runs the three master modes side by side for `steps` steps against the
// float64 reference (whose moments are rounded to bf16 when the kernel's
// are) and checks:
// - kFp32: within the accumulated fp32 rounding of the reference (bf16
//   moments: within the drift their rounding allows, bounded below);
// - kBf16Remainder: bitwise the kFp32 master and moments, at every step;
// - kNone: with stochastic rounding, the mean deviation from the reference
//   is within 5 standard errors of zero (unbiased).
void run_matrix_case(const MatrixCase& mc, int64_t n, int steps) {
  SCOPED_TRACE(describe(mc));
  const OptimizerHyper h = hyper_for(mc.kind);
  const float lr = lr_for(mc.kind);
  const auto init = initial_params(n, 11);
  Shard fp32(n, MasterMode::kFp32, mc.state, DType::kBF16, init);
  Shard rem(n, MasterMode::kBf16Remainder, mc.state, DType::kBF16, init);
  Shard none(n, MasterMode::kNone, mc.state, DType::kBF16, init);
  std::vector<Ref> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i].p = init[i];
  std::vector<double> max_abs_p(n, 0.0);  // along the trajectory: bounds the bf16 ulp
  std::vector<double> path(n, 0.0);       // sum of |step| along the reference trajectory
  const float multiplier = 0.25f;  // e.g. 1 / (loss scale x divisor) x clip
  const bool bf16_state = mc.state == DType::kBF16;
  for (int t = 1; t <= steps; ++t) {
    const Array g = gradients(mc.grad, n, t);
    StepScalars sc;
    sc.lr = lr;
    sc.grad_multiplier = multiplier;
    sc.step = t;
    fused_update_cpu(fp32.args(h, g, mc.rounding), sc);
    fused_update_cpu(rem.args(h, g, mc.rounding), sc);
    fused_update_cpu(none.args(h, g, mc.rounding), sc);
    for (int64_t i = 0; i < n; ++i) {
      // The kernel sees the gradient times the multiplier (a power of two: exact).
      const double before = ref[i].p;
      ref_update(mc.kind, ref[i], static_cast<double>(g.get(i)) * multiplier, ref_step(h, lr, t));
      path[i] += std::fabs(ref[i].p - before);
      max_abs_p[i] = std::max(max_abs_p[i], std::fabs(ref[i].p) + std::fabs(none.param(i) - ref[i].p));
      if (bf16_state) {
        ref[i].m = math::bf16_bits_to_f32(math::f32_to_bf16_bits(static_cast<float>(ref[i].m)));
        ref[i].v = math::bf16_bits_to_f32(math::f32_to_bf16_bits(static_cast<float>(ref[i].v)));
      }
      ASSERT_EQ(math::f32_bits(rem.param(i)), math::f32_bits(fp32.master[i]))
          << "bf16_remainder must be bitwise the fp32 master; step " << t << " element " << i;
    }
    ASSERT_EQ(rem.s0.bytes, fp32.s0.bytes) << "step " << t;
    ASSERT_EQ(rem.s1.bytes, fp32.s1.bytes) << "step " << t;
    // The copy of the fp32 master: nearest-even, or one of its two bf16 neighbours.
    for (int64_t i = 0; i < n; i += 7) {
      uint16_t copy;
      std::memcpy(&copy, fp32.out.bytes.data() + 2 * i, 2);
      const uint16_t nearest = math::f32_to_bf16_bits(fp32.master[i]);
      if (mc.rounding == Rounding::kNearestEven) {
        ASSERT_EQ(copy, nearest);
      } else {
        const uint32_t down = math::f32_bits(fp32.master[i]) >> 16;
        ASSERT_TRUE(copy == down || copy == down + 1) << "step " << t << " element " << i;
      }
    }
  }
  // fp32 master vs the reference. fp32 moments: each step rounds |p| <= 0.3
  // a few times in fp32 (about 2e-8 each), under 2e-5 over 1000 steps. bf16
  // moments: the kernel and the reference round moments computed from
  // slightly different values, so they may land on neighbouring bf16 values;
  // a moment that is off by a few bf16 ulps (2^-8 relative each) moves each
  // step by that fraction, at most 2^-6 of the path length in all.
  // Lion's update is lr x sign(c): where c is within rounding of zero the
  // two may take opposite signs, a 2 lr jump; allow that on a few elements.
  int far = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double tol = 2e-5 + (bf16_state ? 0x1p-6 * path[i] : 0.0);
    const double d = std::fabs(fp32.master[i] - ref[i].p);
    worst = std::max(worst, d / tol);
    if (d > tol) {
      ++far;
      EXPECT_LE(d, 4.0 * lr + tol) << "element " << i;
    }
  }
  const int allowed_far = mc.kind == UpdateRule::kLion ? 3 : 0;
  EXPECT_LE(far, allowed_far) << "elements beyond tolerance of the float64 reference; worst at "
                              << worst << " x tolerance";
  // Pure bf16 with stochastic rounding: unbiased. Each step's rounding error
  // has mean zero and magnitude below one bf16 ulp of the largest |p| on the
  // trajectory (variance below ulp^2 / 4), and feeds back only through
  // weight decay, so the mean deviation over n elements after T steps has
  // standard error below sqrt(sum_i T ulp_i^2 / 4) / n.
  if (mc.rounding == Rounding::kStochastic) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) {
      mean += none.param(i) - ref[i].p;
      const double ulp = std::ldexp(1.0, std::ilogb(std::max(max_abs_p[i], 1e-30)) - 7);
      var += static_cast<double>(steps) * ulp * ulp / 4;
    }
    mean /= static_cast<double>(n);
    const double se = std::sqrt(var) / static_cast<double>(n);
    EXPECT_LT(std::fabs(mean), 5 * se) << "pure bf16 + stochastic rounding drifted from the reference";
  }
}

TEST(FusedUpdate, EveryCombinationFollowsTheFloat64ReferenceFor1000Steps) {
  const int64_t n = 512;
  for (UpdateRule kind : testing::all_rules()) {
    for (DType grad : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (DType state : {DType::kF32, DType::kBF16}) {
        for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
          run_matrix_case(MatrixCase{kind, grad, state, rounding}, n, 1000);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

// ---- skip, stochastic copy, pure low precision ------------------------------

TEST(FusedUpdate, FoundInfSkipsTheWholeStep) {
  const int64_t n = 1000;
  for (MasterMode mode : {MasterMode::kFp32, MasterMode::kBf16Remainder, MasterMode::kNone}) {
    Shard s(n, mode, DType::kF32, DType::kBF16, initial_params(n, 1));
    for (int64_t i = 0; i < n; ++i) s.s0.set(i, 0.25f);
    const Shard before = s;
    Array g = gradients(DType::kF32, n, 1);
    g.set(17, std::numeric_limits<float>::infinity());
    StepScalars sc;
    sc.found_inf = 1;
    fused_update_cpu(s.args(hyper_for(UpdateRule::kAdamW), g, Rounding::kNearestEven), sc);
    EXPECT_EQ(s.master, before.master);
    EXPECT_EQ(s.remainder, before.remainder);
    EXPECT_EQ(s.s0.bytes, before.s0.bytes);
    EXPECT_EQ(s.s1.bytes, before.s1.bytes);
    EXPECT_EQ(s.out.bytes, before.out.bytes);
  }
}

TEST(FusedUpdate, StochasticCopyIsANeighbourAndReproducible) {
  const int64_t n = 4096;
  const auto init = initial_params(n, 2);
  Shard s1(n, MasterMode::kFp32, DType::kF32, DType::kBF16, init), s2 = s1;
  const Array g = gradients(DType::kF32, n, 1);
  OptimizerHyper h;
  h.rule = UpdateRule::kSgd;
  StepScalars sc;
  sc.lr = 1e-2f;
  for (Shard* s : {&s1, &s2}) fused_update_cpu(s->args(h, g, Rounding::kStochastic), sc);
  EXPECT_EQ(s1.out.bytes, s2.out.bytes) << "same seed, same bits";
  int differs_from_nearest = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t copy;
    std::memcpy(&copy, s1.out.bytes.data() + 2 * i, 2);
    const uint32_t down = math::f32_bits(s1.master[i]) >> 16;  // bf16 truncation
    ASSERT_TRUE(copy == down || copy == down + 1) << i;
    differs_from_nearest += copy != math::f32_to_bf16_bits(s1.master[i]);
  }
  EXPECT_GT(differs_from_nearest, n / 20) << "stochastic rounding should not always round to nearest";
}

// Pure bf16 parameters (no master): updates below half an ulp vanish with
// nearest rounding, but stochastic rounding keeps them in expectation.
TEST(FusedUpdate, NoneModeWithStochasticRoundingKeepsUpdatesBelowHalfAnUlp) {
  const int64_t n = 1 << 16;
  const float start = 1.0f;     // just below 1.0 the bf16 ulp is 2^-8
  const float delta = 0x1p-10;  // so each step moves a quarter of an ulp
  Array g(DType::kF32, n);
  for (int64_t i = 0; i < n; ++i) g.set(i, 1.0f);
  OptimizerHyper h;
  h.rule = UpdateRule::kSgd;
  for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
    Shard s(n, MasterMode::kNone, DType::kF32, DType::kBF16, std::vector<float>(n, start));
    for (int t = 1; t <= 8; ++t) {
      StepScalars sc;
      sc.lr = delta;
      sc.step = t;
      fused_update_cpu(s.args(h, g, rounding), sc);
    }
    double mean = 0;
    for (int64_t i = 0; i < n; ++i) mean += s.param(i);
    mean /= n;
    const double expected = start - 8 * delta;  // 1 - 2^-7, two bf16 ulps below 1.0
    if (rounding == Rounding::kNearestEven) {
      EXPECT_EQ(mean, start) << "each update is below half an ulp: nearest rounding loses all of them";
    } else {
      // Each element ends in [1 - 2^-6, 1]; the mean's standard error is
      // below 2^-6 / sqrt(n) = 6e-5.
      EXPECT_NEAR(mean, expected, 2e-4) << "stochastic rounding keeps the updates in expectation";
    }
  }
}

// ---- the per-range table ---------------------------------------------------

// A table of three groups gives the bits of three separate steps, each with
// its group's learning rate and weight decay folded into the arguments.
TEST(FusedUpdate, RangeTableAppliesEachGroupsLrAndWeightDecay) {
  const int64_t n = 3000;
  const std::vector<UpdateRange> table{{0, 1000, 1.0f, 1.0f}, {1000, 1001, 0.5f, 0.0f}, {1001, 3000, 2.0f, 0.0f}};
  for (UpdateRule kind : testing::all_rules()) {
    const auto init = initial_params(n, 4);
    Shard whole(n, MasterMode::kFp32, DType::kF32, DType::kBF16, init);
    std::vector<Shard> parts;
    for (const auto& r : table) {
      parts.emplace_back(r.end - r.begin, MasterMode::kFp32, DType::kF32, DType::kBF16,
                         std::vector<float>(init.begin() + r.begin, init.begin() + r.end));
    }
    for (int t = 1; t <= 3; ++t) {
      const Array g = gradients(DType::kBF16, n, t);
      StepScalars sc;
      sc.lr = lr_for(kind);
      sc.step = t;
      UpdateArgs a = whole.args(hyper_for(kind), g, Rounding::kNearestEven);
      a.ranges = table.data();
      a.num_ranges = static_cast<int64_t>(table.size());
      fused_update_cpu(a, sc);
      for (size_t k = 0; k < table.size(); ++k) {
        Array gk(DType::kBF16, table[k].end - table[k].begin);
        std::memcpy(gk.bytes.data(), g.bytes.data() + 2 * table[k].begin, gk.bytes.size());
        OptimizerHyper hk = hyper_for(kind);
        hk.weight_decay *= table[k].weight_decay_scale;
        StepScalars sk = sc;
        sk.lr *= table[k].lr_scale;
        fused_update_cpu(parts[k].args(hk, gk, Rounding::kNearestEven), sk);
      }
    }
    for (size_t k = 0; k < table.size(); ++k) {
      for (int64_t i = table[k].begin; i < table[k].end; ++i) {
        ASSERT_EQ(math::f32_bits(whole.master[i]), math::f32_bits(parts[k].master[i - table[k].begin]))
            << kind_name(kind) << " group " << k << " element " << i;
      }
    }
  }
}

// Skipped ranges (Muon's matrices) are left alone, and the second moments
// of the others can live in a compact state1 (UpdateRange::state1_shift):
// the same bits as a full one, with nothing kept for the skipped elements.
TEST(FusedUpdate, SkippedRangesNeedNoSecondMoment) {
  const int64_t n = 1000, kept = 1000 - 192 - 256;
  // AdamW | skipped 200 + 10 (two groups, one run) | AdamW | skipped 300
  std::vector<UpdateRange> full{{0, 100, 1.0f, 1.0f},
                                {100, 300, 1.0f, 1.0f, 1},
                                {300, 310, 0.5f, 1.0f, 1},
                                {310, 700, 2.0f, 0.0f},
                                {700, n, 1.0f, 1.0f, 1}};
  std::vector<UpdateRange> compact = full;
  compact[3].state1_shift = compact[4].state1_shift = 192;  // the first run's 210, less 210 mod 64
  const auto init = initial_params(n, 5);
  Shard a(n, MasterMode::kFp32, DType::kF32, DType::kBF16, init), b = a;
  b.s1 = Array(DType::kF32, kept);
  for (int t = 1; t <= 3; ++t) {
    const Array g = gradients(DType::kBF16, n, t);
    StepScalars sc;
    sc.lr = 1e-2f;
    sc.step = t;
    for (auto [shard, table] : {std::pair{&a, &full}, std::pair{&b, &compact}}) {
      UpdateArgs args = shard->args(hyper_for(UpdateRule::kAdamW), g, Rounding::kNearestEven);
      args.ranges = table->data();
      args.num_ranges = static_cast<int64_t>(table->size());
      args.state1_numel = shard == &b ? kept : -1;
      fused_update_cpu(args, sc);
    }
  }
  EXPECT_EQ(a.master, b.master);
  EXPECT_EQ(a.s0.bytes, b.s0.bytes);
  EXPECT_EQ(a.out.bytes, b.out.bytes);
  for (const UpdateRange& r : compact) {
    for (int64_t i = r.begin; i < r.end; ++i) {
      if (r.skip != 0) {
        ASSERT_EQ(math::f32_bits(a.master[i]), math::f32_bits(init[i])) << "skipped element " << i << " was written";
      } else {
        ASSERT_EQ(a.s1.get(i), b.s1.get(i - r.state1_shift)) << "second moment of element " << i;
      }
    }
  }
}

void expect_error(const UpdateArgs& a, const std::string& needle) {
  try {
    fused_update_cpu(a, StepScalars{});
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const EnforceError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(FusedUpdate, BadArgumentsAreNamed) {
  const int64_t n = 100;
  Shard s(n, MasterMode::kFp32, DType::kF32, DType::kBF16, initial_params(n, 1));
  const Array g = gradients(DType::kF32, n, 1);
  const UpdateArgs ok = s.args(hyper_for(UpdateRule::kAdamW), g, Rounding::kNearestEven);

  std::vector<UpdateRange> gap{{0, 40, 1, 1}, {50, 100, 1, 1}};
  UpdateArgs a = ok;
  a.ranges = gap.data();
  a.num_ranges = 2;
  expect_error(a, "range 1 is [50, 100)");
  std::vector<UpdateRange> short_table{{0, 40, 1, 1}, {40, 90, 1, 1}};
  a.ranges = short_table.data();
  expect_error(a, "the ranges cover [0, 90) but the shard has 100 elements");
  std::vector<UpdateRange> nan_scale{{0, 100, std::nanf(""), 1}};
  a.ranges = nan_scale.data();
  a.num_ranges = 1;
  expect_error(a, "range 0 has a non-finite scale");

  std::vector<UpdateRange> odd_shift{{0, 50, 1, 1, 1}, {50, 100, 1, 1, 0, 0, 32}};
  a.ranges = odd_shift.data();
  a.num_ranges = 2;
  expect_error(a, "range 1 has state1_shift 32 (a multiple of 64");
  std::vector<UpdateRange> overlapping{{0, 70, 1, 1}, {70, 80, 1, 1, 1}, {80, 100, 1, 1, 0, 0, 64}};
  a.ranges = overlapping.data();
  a.num_ranges = 3;
  a.state1_numel = 90;
  expect_error(a, "range 2 keeps its state1 at [16, 36), overlapping the range before it");
  overlapping[2].state1_shift = 0;
  expect_error(a, "range 2 keeps its state1 at [80, 100), overlapping the range before it or past state1's 90");
  a.ranges = nullptr;
  a.num_ranges = 0;
  expect_error(a, "state1 has 90 elements for a shard of 100 updated whole");

  a = ok;
  a.state1 = a.state0;
  expect_error(a, "state0 and state1 overlap");
  a = ok;
  a.param_out = reinterpret_cast<char*>(a.master) + 8;
  expect_error(a, "master and param_out overlap");
  a = ok;
  a.state_dtype = DType::kF16;
  expect_error(a, "optimizer state must be fp32 or bf16, not fp16");
  a = ok;
  std::vector<int16_t> remainder(n);
  a.master_mode = MasterMode::kBf16Remainder;
  a.param_dtype = DType::kF16;
  a.master_remainder = remainder.data();
  expect_error(a, "bf16_remainder keeps a bf16 parameter copy, not fp16");
  a = ok;
  a.state1 = nullptr;
  expect_error(a, "its rule keeps 2 state arrays; state1 is missing");
  a = ok;
  a.isa = CpuIsa::kAvx512;
  if (!cpu_isa_available(CpuIsa::kAvx512)) expect_error(a, "no avx512 variant");
}

TEST(FusedUpdate, BytesPerParameter) {
  UpdateArgs a;
  uint16_t dummy = 0;
  a.grad_dtype = DType::kBF16;
  a.param_out = &dummy;
  EXPECT_EQ(update_bytes_per_param(a), 28);  // AdamW, fp32 master, fp32 moments, bf16 copy
  a.master_mode = MasterMode::kBf16Remainder;
  EXPECT_EQ(update_bytes_per_param(a), 26);
  a.master_mode = MasterMode::kNone;
  EXPECT_EQ(update_bytes_per_param(a), 22);
  a.state_dtype = DType::kBF16;
  EXPECT_EQ(update_bytes_per_param(a), 14);
  a.hyper.rule = UpdateRule::kSgd;
  EXPECT_EQ(update_bytes_per_param(a), 6);
}

}  // namespace
}  // namespace mp

// The fused optimizer step (fp32 master) against a plain float64 reference:
// one step from the same state, 1000-step trajectories, the state and copy
// dtypes, found_inf and stochastic rounding of the copy.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/convert_math.h"
#include "kernels/cpu/update.h"

namespace mp {
namespace {

// ---- float64 reference, written plainly from the torch formulas ----------
struct Ref {
  double p, m, v;
};

void ref_adamw(Ref& r, double g, const math::AdamWStep& s) {
  r.p *= 1.0 - static_cast<double>(s.lr) * s.weight_decay;
  r.m += (1.0 - s.beta1) * (g - r.m);
  r.v = s.beta2 * r.v + (1.0 - s.beta2) * g * g;
  r.p -= (static_cast<double>(s.lr) / s.bias_correction1) * r.m / (std::sqrt(r.v) / s.bias_correction2_sqrt + s.eps);
}

void ref_sgd(Ref& r, double g, const math::SgdStep& s) {
  g += s.weight_decay * r.p;
  r.m = s.first_step ? g : s.momentum * r.m + (1.0 - s.dampening) * g;
  r.p -= s.lr * (s.nesterov ? g + s.momentum * r.m : r.m);
}

void ref_lion(Ref& r, double g, const math::LionStep& s) {
  r.p *= 1.0 - static_cast<double>(s.lr) * s.weight_decay;
  const double c = s.beta1 * r.m + (1.0 - s.beta1) * g;
  r.p -= s.lr * (c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0);
  r.m = s.beta2 * r.m + (1.0 - s.beta2) * g;
}

math::AdamWStep adamw_step(int t) {
  math::AdamWStep s;
  s.lr = 1e-3f;
  s.weight_decay = 0.1f;
  s.bias_correction1 = static_cast<float>(1.0 - std::pow(0.9, t));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(0.999, t)));
  return s;
}

struct Shard {
  std::vector<float> master, m, v;
  std::vector<uint16_t> copy;
};

Shard make_shard(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  Shard s;
  for (int64_t i = 0; i < n; ++i) s.master.push_back(normal(rng));
  s.m.assign(n, 0.0f);
  s.v.assign(n, 0.0f);
  s.copy.assign(n, 0);
  return s;
}

std::vector<float> gradients(int64_t n, int t) {
  std::mt19937_64 rng(1000 + static_cast<uint64_t>(t));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n);
  for (auto& x : g) x = normal(rng) * (1 + t % 7);
  return g;
}

UpdateArgs args_for(Shard& s, const std::vector<float>& g, OptimizerKind kind) {
  UpdateArgs a;
  a.kind = kind;
  a.n = static_cast<int64_t>(s.master.size());
  a.master = s.master.data();
  a.state0 = s.m.data();
  a.state1 = kind == OptimizerKind::kAdamW ? s.v.data() : nullptr;
  a.grad = g.data();
  a.param_out = s.copy.data();
  a.param_dtype = DType::kBF16;
  return a;
}

// One step from the same state: the fp32 kernel is within a few fp32 ulps of
// the float64 reference started from the same (fp32) values.
TEST(FusedUpdate, OneStepMatchesFloat64ToFloatRounding) {
  const int64_t n = 4096;
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd, OptimizerKind::kLion}) {
    Shard s = make_shard(n, 3);
    for (int t = 1; t <= 5; ++t) {
      const auto g = gradients(n, t);
      std::vector<Ref> ref(n);
      for (int64_t i = 0; i < n; ++i) ref[i] = Ref{s.master[i], s.m[i], s.v[i]};
      const std::vector<float> before = s.master, m_before = s.m;
      UpdateArgs a = args_for(s, g, kind);
      a.adamw = adamw_step(t);
      a.sgd = math::SgdStep{1e-2f, 0.9f, 0.0f, 1e-4f, true, t == 1};
      a.lion = math::LionStep{1e-4f, 0.9f, 0.99f, 0.1f};
      fused_update_cpu(a, false);
      for (int64_t i = 0; i < n; ++i) {
        switch (kind) {
          case OptimizerKind::kAdamW: ref_adamw(ref[i], g[i], a.adamw); break;
          case OptimizerKind::kSgd: ref_sgd(ref[i], g[i], a.sgd); break;
          case OptimizerKind::kLion: ref_lion(ref[i], g[i], a.lion); break;
        }
        // A handful of fp32 roundings at the scale of |p|, of the update, and
        // of the terms that may cancel inside it (g and the moments, times
        // the effective learning rate).
        const double p_old = before[i];
        const double lr = kind == OptimizerKind::kSgd     ? a.sgd.lr
                          : kind == OptimizerKind::kAdamW ? a.adamw.lr / a.adamw.bias_correction1
                                                          : a.lion.lr;
        const double terms = std::fabs(g[i]) + std::fabs(m_before[i]) + std::fabs(ref[i].m);
        const double tol = 16 * 0x1p-24 * (std::fabs(p_old) + std::fabs(ref[i].p - p_old) + lr * terms);
        ASSERT_NEAR(s.master[i], ref[i].p, tol) << "optimizer " << static_cast<int>(kind) << " step " << t << " i " << i;
        // m + (1 - b1)(g - m) rounds at the scale of g, not of the (small) result.
        ASSERT_NEAR(s.m[i], ref[i].m, 8 * 0x1p-24 * (std::fabs(ref[i].m) + std::fabs(g[i])));
        ASSERT_EQ(s.copy[i], math::f32_to_bf16_bits(s.master[i])) << "the copy is the master rounded once";
      }
    }
  }
}

TEST(FusedUpdate, ThousandStepTrajectoriesStayWithFloatRounding) {
  const int64_t n = 2048;
  for (DType grad_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    Shard s = make_shard(n, 5);
    std::vector<Ref> ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = Ref{s.master[i], 0, 0};
    for (int t = 1; t <= 1000; ++t) {
      auto g = gradients(n, t);
      std::vector<uint16_t> g16(n);
      for (int64_t i = 0; i < n; ++i) {
        g16[i] = grad_dtype == DType::kBF16 ? math::f32_to_bf16_bits(g[i]) : math::f32_to_fp16_bits(g[i]);
        if (grad_dtype != DType::kF32) {
          g[i] = grad_dtype == DType::kBF16 ? math::bf16_bits_to_f32(g16[i]) : math::fp16_bits_to_f32(g16[i]);
        }
      }
      UpdateArgs a = args_for(s, g, OptimizerKind::kAdamW);
      if (grad_dtype != DType::kF32) a.grad = g16.data();
      a.grad_dtype = grad_dtype;
      a.grad_multiplier = 0.5f;  // e.g. 1 / (loss scale x divisor)
      a.adamw = adamw_step(t);
      fused_update_cpu(a, false);
      for (int64_t i = 0; i < n; ++i) ref_adamw(ref[i], 0.5 * g[i], a.adamw);
    }
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(s.master[i] - ref[i].p));
    // Each step rounds |p| <= 0.2 a few times in fp32 (about 1.2e-8 each);
    // over 1000 steps that is at most about 1.2e-5 (measured: 3e-6).
    EXPECT_LT(worst, 1.2e-5) << dtype_name(grad_dtype);
  }
}

TEST(FusedUpdate, Bf16StateStaysCloseAndRepresentable) {
  const int64_t n = 2048;
  Shard s = make_shard(n, 9), s32 = make_shard(n, 9);
  std::vector<uint16_t> m16(n, 0), v16(n, 0);
  for (int t = 1; t <= 200; ++t) {
    const auto g = gradients(n, t);
    UpdateArgs a = args_for(s, g, OptimizerKind::kAdamW);
    a.state0 = m16.data();
    a.state1 = v16.data();
    a.state_dtype = DType::kBF16;
    a.adamw = adamw_step(t);
    fused_update_cpu(a, false);
    UpdateArgs b = args_for(s32, g, OptimizerKind::kAdamW);
    b.adamw = adamw_step(t);
    fused_update_cpu(b, false);
  }
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(static_cast<double>(s.master[i]) - s32.master[i]));
  EXPECT_GT(worst, 0.0) << "bf16 moments must differ somewhere from fp32 moments";
  EXPECT_LT(worst, 2e-3) << "200 steps of lr 1e-3 with bf16 moments";
}

TEST(FusedUpdate, FoundInfSkipsTheWholeStep) {
  const int64_t n = 1000;
  Shard s = make_shard(n, 1);
  s.m.assign(n, 0.25f);
  s.copy.assign(n, 0x1234);
  const Shard before = s;
  auto g = gradients(n, 1);
  g[17] = std::numeric_limits<float>::infinity();
  UpdateArgs a = args_for(s, g, OptimizerKind::kAdamW);
  a.adamw = adamw_step(1);
  fused_update_cpu(a, /*found_inf=*/true);
  EXPECT_EQ(s.master, before.master);
  EXPECT_EQ(s.m, before.m);
  EXPECT_EQ(s.v, before.v);
  EXPECT_EQ(s.copy, before.copy);
}

TEST(FusedUpdate, StochasticCopyIsANeighbourAndReproducible) {
  const int64_t n = 4096;
  Shard s1 = make_shard(n, 2), s2 = make_shard(n, 2);
  const auto g = gradients(n, 1);
  for (Shard* s : {&s1, &s2}) {
    UpdateArgs a = args_for(*s, g, OptimizerKind::kSgd);
    a.rounding = Rounding::kStochastic;
    a.seed = 77;
    a.step = 1;
    a.sgd = math::SgdStep{1e-2f, 0.0f, 0.0f, 0.0f, false, true};
    fused_update_cpu(a, false);
  }
  int differs_from_nearest = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(s1.copy[i], s2.copy[i]) << "same seed, same bits";
    const uint32_t down = math::f32_bits(s1.master[i]) >> 16;  // bf16 truncation
    ASSERT_TRUE(s1.copy[i] == down || s1.copy[i] == down + 1) << i;
    differs_from_nearest += s1.copy[i] != math::f32_to_bf16_bits(s1.master[i]);
  }
  EXPECT_GT(differs_from_nearest, n / 20) << "stochastic rounding should not always round to nearest";
}

}  // namespace
}  // namespace mp

namespace mp {
namespace {

// Pure bf16 parameters (no master): updates below half an ulp vanish with
// nearest rounding, but stochastic rounding keeps them in expectation.
TEST(FusedUpdate, NoneModeWithStochasticRoundingStaysUnbiased) {
  const int64_t n = 1 << 16;
  const float start = 1.0f;     // just below 1.0 the bf16 ulp is 2^-8
  const float delta = 0x1p-10;  // so each step moves a quarter of an ulp
  std::vector<float> g(n, 1.0f);
  for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
    std::vector<uint16_t> p(n, math::f32_to_bf16_bits(start));
    for (int t = 1; t <= 8; ++t) {
      UpdateArgs a;
      a.kind = OptimizerKind::kSgd;
      a.master_mode = MasterMode::kNone;
      a.n = n;
      a.grad = g.data();
      a.param_out = p.data();
      a.param_dtype = DType::kBF16;
      a.rounding = rounding;
      a.seed = 5;
      a.step = static_cast<uint64_t>(t);
      a.sgd = math::SgdStep{delta, 0.0f, 0.0f, 0.0f, false, true};
      fused_update_cpu(a, false);
    }
    double mean = 0;
    for (uint16_t b : p) mean += math::bf16_bits_to_f32(b);
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

}  // namespace
}  // namespace mp

// optim/muon.h: the Muon step on one matrix against a float64 reference of
// the whole step over three steps (Note [Muon step tolerances] in
// tests/muon_reference.h), torch's adjusted learning rates, the same bits
// for any thread count, and which GPT parameters Muon takes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/muon.h"
#include "tests/muon_reference.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::ref_distance;
using testing::sci;

struct StepsResult {
  std::vector<float> param, momentum;
};

// `grads.size()` steps of muon_step_cpu from param (momentum zeros).
StepsResult run_steps(const MuonHyper& h, int64_t rows, int64_t cols, std::vector<float> param,
              const std::vector<std::vector<float>>& grads, double lr, double wd, int threads = 0,
              bool own_scratch = false) {
  StepsResult r{std::move(param), std::vector<float>(static_cast<size_t>(rows * cols), 0.0f)};
  std::vector<float> scratch;
  if (own_scratch) scratch.assign(static_cast<size_t>(muon_scratch_elements(rows, cols, h)), std::nanf(""));
  for (const std::vector<float>& g : grads) {
    MuonMatrix m;
    m.param = r.param.data();
    m.momentum = r.momentum.data();
    m.grad = g.data();
    m.rows = rows;
    m.cols = cols;
    MuonStep s;
    s.lr = lr;
    s.weight_decay = wd;
    s.threads = threads;
    if (own_scratch) {
      s.scratch = scratch.data();
      s.scratch_elements = static_cast<int64_t>(scratch.size());
    }
    muon_step_cpu(h, m, s);
  }
  return r;
}

std::vector<std::vector<double>> to_double(const std::vector<std::vector<float>>& v) {
  std::vector<std::vector<double>> out;
  for (const auto& x : v) out.push_back(testing::to_double(x));
  return out;
}

struct Case {
  std::string name;
  MuonHyper hyper;
  double lr, wd;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"defaults", MuonHyper{}, 0.02, 0.1});
  MuonHyper heavy;
  heavy.momentum = 0.9;
  heavy.nesterov = false;
  heavy.adjust_lr = MuonAdjustLr::kMatchRmsAdamW;
  out.push_back({"heavy_ball", heavy, 0.05, 0.05});
  MuonHyper spectral;
  spectral.momentum = 0.3;  // the other branch of torch's lerp for both lerps
  spectral.adjust_lr = MuonAdjustLr::kSpectralUnclamped;
  spectral.ns_steps = 4;
  out.push_back({"spectral", spectral, 0.03, 0.0});
  return out;
}

TEST(Muon, ThreeStepsMatchTheFloat64Reference) {
  const int64_t rows = 48, cols = 64;
  const std::vector<float> param = testing::random_values(rows * cols, 1, 0.05f);
  std::vector<std::vector<float>> grads;
  for (uint32_t t = 0; t < 3; ++t) grads.push_back(testing::random_values(rows * cols, 10 + t));
  for (Case c : cases()) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      for (const bool tall : {false, true}) {
        c.hyper.iteration_dtype = dtype;
        const int64_t r = tall ? cols : rows, k = tall ? rows : cols;
        const std::string what = c.name + " " + std::string(dtype_name(dtype)) + (tall ? " tall" : " wide");
        const StepsResult mp = run_steps(c.hyper, r, k, param, grads, c.lr, c.wd);
        const testing::MuonReferenceRun ref = testing::muon_reference_run(
            c.hyper, r, k, r, k, testing::to_double(param), to_double(grads), c.lr, c.wd);
        const double dp = ref_distance(testing::to_double(mp.param), ref.param);
        const double dm = ref_distance(testing::to_double(mp.momentum), ref.momentum);
        EXPECT_LE(dp, ref.param_bound) << what;
        EXPECT_LE(dm, ref.momentum_bound) << what;
        RecordProperty("param " + what, sci(dp) + " (bound " + sci(ref.param_bound) + ")");
      }
    }
  }
}

TEST(Muon, AdjustedLrIsTorchs) {
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.02, MuonAdjustLr::kOriginal, 64, 48), 0.02 * std::sqrt(64.0 / 48.0));
  EXPECT_EQ(muon_adjusted_lr(0.02, MuonAdjustLr::kOriginal, 48, 64), 0.02);  // max(1, A / B)
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.02, MuonAdjustLr::kMatchRmsAdamW, 48, 64), 0.02 * 0.2 * 8.0);
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.02, MuonAdjustLr::kSpectralUnclamped, 48, 64), 0.02 * std::sqrt(0.75));
}

TEST(Muon, SameBitsForAnyThreadCountAndScratch) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    MuonHyper h;
    h.iteration_dtype = dtype;
    const int64_t rows = 53, cols = 37;
    const std::vector<float> param = testing::random_values(rows * cols, 2, 0.05f);
    const std::vector<std::vector<float>> grads = {testing::random_values(rows * cols, 3),
                                                   testing::random_values(rows * cols, 4)};
    const StepsResult one = run_steps(h, rows, cols, param, grads, 0.02, 0.1, 1);
    const StepsResult two = run_steps(h, rows, cols, param, grads, 0.02, 0.1, 2, /*own_scratch=*/true);
    EXPECT_TRUE(testing::same_bits(one.param, two.param)) << dtype_name(dtype);
    EXPECT_TRUE(testing::same_bits(one.momentum, two.momentum)) << dtype_name(dtype);
  }
}

TEST(Muon, GradMultiplierScalesTheGradient) {
  MuonHyper h;
  const int64_t rows = 16, cols = 24;
  std::vector<float> g = testing::random_values(rows * cols, 5);
  std::vector<float> g4(g.size());
  for (size_t i = 0; i < g.size(); ++i) g4[i] = g[i] * 4.0f;  // exact
  const StepsResult plain = run_steps(h, rows, cols, std::vector<float>(g.size(), 0.5f), {g}, 0.02, 0.1);
  StepsResult scaled{std::vector<float>(g.size(), 0.5f), std::vector<float>(g.size(), 0.0f)};
  MuonMatrix m{.param = scaled.param.data(), .momentum = scaled.momentum.data(), .grad = g4.data(), .rows = rows, .cols = cols};
  MuonStep s;
  s.lr = 0.02;
  s.weight_decay = 0.1;
  s.grad_multiplier = 0.25f;
  muon_step_cpu(h, m, s);
  EXPECT_TRUE(testing::same_bits(plain.param, scaled.param));
  EXPECT_TRUE(testing::same_bits(plain.momentum, scaled.momentum));
}

// Note [Muon and the GPT].
TEST(Muon, GptAssignmentTakesTheBlocksMatrices) {
  const MuonAssignment fc = gpt_muon_assignment("h0.mlp.c_fc.weight", {768, 3072});
  EXPECT_TRUE(fc.muon);
  EXPECT_EQ(fc.lr_a, 3072);  // fan-out, as nn.Linear's [out, in] would be read
  EXPECT_EQ(fc.lr_b, 768);
  EXPECT_TRUE(gpt_muon_assignment("h11.attn.c_attn.weight", {768, 2304}).muon);
  EXPECT_TRUE(gpt_muon_assignment("h3.attn.c_proj.weight", {768, 768}).muon);
  EXPECT_TRUE(gpt_muon_assignment("h3.mlp.c_proj.weight", {3072, 768}).muon);
  for (const char* name : {"h0.ln_1.weight", "h0.ln_1.bias", "h0.attn.c_attn.bias", "h2.mlp.c_proj.bias"}) {
    EXPECT_FALSE(gpt_muon_assignment(name, {768}).muon) << name;
  }
  EXPECT_FALSE(gpt_muon_assignment("wte", {50304, 768}).muon);
  EXPECT_FALSE(gpt_muon_assignment("wpe", {1024, 768}).muon);
  EXPECT_FALSE(gpt_muon_assignment("ln_f.weight", {768}).muon);
  EXPECT_FALSE(gpt_muon_assignment("head.weight", {768, 768}).muon);  // outside the blocks
}

TEST(Muon, BadArgumentsAreRefused) {
  MuonHyper h;
  std::vector<float> p(12, 0.0f), m(12, 0.0f), g(12, 1.0f);
  MuonMatrix x{.param = p.data(), .momentum = m.data(), .grad = g.data(), .rows = 3, .cols = 4};
  MuonStep s;
  s.lr = 0.02;
  std::vector<float> scratch(4);
  s.scratch = scratch.data();
  s.scratch_elements = 4;
  EXPECT_TRUE(testing::contains(testing::error_of<EnforceError>([&] { muon_step_cpu(h, x, s); }), "scratch of 4"));
  s.scratch = nullptr;
  x.lr_a = 3;
  EXPECT_TRUE(testing::contains(testing::error_of<EnforceError>([&] { muon_step_cpu(h, x, s); }), "both or neither"));
  x.lr_a = 0;
  x.grad = nullptr;
  EXPECT_TRUE(testing::contains(testing::error_of<EnforceError>([&] { muon_step_cpu(h, x, s); }), "null"));
}

}  // namespace
}  // namespace mp

// optim/optimizer.h: OptimizerConfig defaults and validation, the step
// decision (clipping, loss scaling, skips), the range table of a shard, and
// a clipped, loss-scaled AdamW run over two shards against float64.
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/grad_stats.h"
#include "kernels/cpu/update.h"
#include "optim/optimizer.h"
#include "tests/test_util.h"

namespace mp {
namespace {

proto::OptimizerConfig parse(const std::string& text) {
  proto::OptimizerConfig c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &c)) << text;
  return c;
}

void expect_config_error(const std::string& text, const std::string& needle) {
  const std::string message = testing::error_of<ConfigError>([&] { Optimizer opt(parse(text)); });
  EXPECT_NE(message.find(needle), std::string::npos) << "for: " << text << "\n" << message;
}

TEST(Optimizer, DefaultsAreThoseOfTheReferenceImplementations) {
  const Optimizer adamw(parse(""));
  EXPECT_EQ(adamw.hyper().rule, UpdateRule::kAdamW);
  EXPECT_EQ(adamw.schedule().lr, 1e-3);
  EXPECT_EQ(adamw.hyper().beta1, 0.9f);
  EXPECT_EQ(adamw.hyper().beta2, 0.999f);
  EXPECT_EQ(adamw.hyper().eps, 1e-8f);
  EXPECT_EQ(adamw.hyper().weight_decay, 0.01f);  // torch.optim.AdamW
  EXPECT_EQ(adamw.state_count(), 2);
  EXPECT_FALSE(adamw.loss_scaling());
  const Optimizer sgd(parse("kind: SGD"));
  EXPECT_EQ(sgd.hyper().weight_decay, 0.0f);
  EXPECT_EQ(sgd.state_count(), 0);
  EXPECT_EQ(Optimizer(parse("kind: SGD momentum: 0.9 nesterov: true")).state_count(), 1);
  const Optimizer lion(parse("kind: LION"));
  EXPECT_EQ(lion.schedule().lr, 1e-4);
  EXPECT_EQ(lion.hyper().beta2, 0.99f);
  EXPECT_EQ(lion.state_count(), 1);
  const Optimizer explicit_zero(parse("weight_decay: 0"));
  EXPECT_EQ(explicit_zero.hyper().weight_decay, 0.0f) << "an explicit 0 is not the default";
  const Optimizer scaled(parse("loss_scaling {}"));
  ASSERT_TRUE(scaled.loss_scaling());
  EXPECT_EQ(scaled.loss_scaler()->scale(), 65536.0);
}

TEST(Optimizer, BadConfigsNameTheField) {
  expect_config_error("beta2: 1.5", "optimizer.beta2 = 1.5: must be in [0, 1)");
  expect_config_error("lr: -1", "optimizer.lr = -1");
  expect_config_error("kind: SGD nesterov: true", "optimizer.nesterov: needs momentum > 0");
  expect_config_error("kind: SGD beta1: 0.5", "optimizer.beta1: SGD has no beta1; it is AdamW's and Lion's");
  expect_config_error("momentum: 0.9", "optimizer.momentum: AdamW has no momentum; it is SGD's");
  expect_config_error("kind: LION eps: 1e-6", "Lion has no eps");
  expect_config_error("grad_clip: -1", "optimizer.grad_clip = -1");
  expect_config_error("schedule { warmup_steps: 10 total_steps: 5 }", "optimizer.schedule: ");
  expect_config_error("loss_scaling { backoff_factor: 2 }", "optimizer.loss_scaler.backoff_factor = 2");
  expect_config_error("param_groups { name_regex: \"(\" }", "optimizer.param_groups[0].name_regex = '('");
  expect_config_error("param_groups { name_regex: \"x\" lr_scale: -1 }", "optimizer.param_groups[0].lr_scale = -1");
}

TEST(Optimizer, MuonDefaultsAreTorchs) {
  const Optimizer opt(parse("kind: MUON"));
  ASSERT_NE(opt.muon(), nullptr);
  const MuonSettings& m = *opt.muon();
  EXPECT_EQ(opt.schedule().lr, 1e-3);  // torch.optim.Muon
  EXPECT_EQ(m.weight_decay, 0.1);
  EXPECT_EQ(m.hyper.momentum, 0.95);
  EXPECT_TRUE(m.hyper.nesterov);
  EXPECT_EQ(m.hyper.ns_a, 3.4445);
  EXPECT_EQ(m.hyper.ns_b, -4.7750);
  EXPECT_EQ(m.hyper.ns_c, 2.0315);
  EXPECT_EQ(m.hyper.ns_steps, 5);
  EXPECT_EQ(m.hyper.eps, 1e-7);
  EXPECT_EQ(m.hyper.adjust_lr, MuonAdjustLr::kOriginal);
  EXPECT_EQ(m.hyper.iteration_dtype, DType::kBF16);
  // The other parameters' AdamW: torch.optim.AdamW's defaults, and the fused update's hyper.
  EXPECT_EQ(m.adamw_lr, 1e-3);
  EXPECT_EQ(opt.hyper().rule, UpdateRule::kAdamW);
  EXPECT_EQ(opt.hyper().beta1, 0.9f);
  EXPECT_EQ(opt.hyper().beta2, 0.999f);
  EXPECT_EQ(opt.hyper().eps, 1e-8f);
  EXPECT_EQ(opt.hyper().weight_decay, 0.01f);
  EXPECT_EQ(Optimizer(parse("")).muon(), nullptr);

  const Optimizer set(parse("kind: MUON lr: 0.02 weight_decay: 0 schedule { warmup_steps: 4 } muon { momentum: 0.9 "
                            "nesterov: false ns_coefficients: [3, -3.2, 1.2] ns_steps: 3 eps: 1e-6 "
                            "adjust_lr_fn: MATCH_RMS_ADAMW iteration_dtype: FP32 adamw_lr: 0.004 adamw_beta1: 0.8 "
                            "adamw_beta2: 0.95 adamw_eps: 1e-10 adamw_weight_decay: 0 }"));
  const MuonSettings& s = *set.muon();
  EXPECT_EQ(s.weight_decay, 0.0);
  EXPECT_EQ(s.hyper.momentum, 0.9);
  EXPECT_FALSE(s.hyper.nesterov);
  EXPECT_EQ(s.hyper.ns_a, 3.0);
  EXPECT_EQ(s.hyper.ns_b, -3.2);
  EXPECT_EQ(s.hyper.ns_c, 1.2);
  EXPECT_EQ(s.hyper.ns_steps, 3);
  EXPECT_EQ(s.hyper.eps, 1e-6);
  EXPECT_EQ(s.hyper.adjust_lr, MuonAdjustLr::kMatchRmsAdamW);
  EXPECT_EQ(s.hyper.iteration_dtype, DType::kF32);
  EXPECT_EQ(set.hyper().beta1, 0.8f);
  EXPECT_EQ(set.hyper().eps, 1e-10f);
  EXPECT_EQ(set.hyper().weight_decay, 0.0f);
  // The schedule scales the AdamW lr as it scales the Muon lr.
  EXPECT_DOUBLE_EQ(set.element_lr(set.schedule().at(0)), 0.004 / 4);
  EXPECT_DOUBLE_EQ(set.element_lr(set.schedule().at(10)), 0.004);
}

TEST(Optimizer, BadMuonConfigsNameTheField) {
  expect_config_error("kind: MUON muon { ns_steps: 0 }", "optimizer.muon.ns_steps = 0: must be in [1, 100)");
  expect_config_error("kind: MUON muon { ns_steps: 100 }", "optimizer.muon.ns_steps = 100");
  expect_config_error("kind: MUON muon { ns_coefficients: [1, 2] }",
                      "optimizer.muon.ns_coefficients: 2 values; need exactly 3");
  expect_config_error("kind: MUON muon { ns_coefficients: [1, 2, 3, 4] }", "optimizer.muon.ns_coefficients: 4 values");
  expect_config_error("kind: MUON muon { ns_coefficients: [1, nan, 3] }", "optimizer.muon.ns_coefficients[1] = nan");
  expect_config_error("kind: MUON muon { momentum: 1 }", "optimizer.muon.momentum = 1: must be in [0, 1)");
  expect_config_error("kind: MUON muon { momentum: -0.1 }", "optimizer.muon.momentum = -0.1");
  expect_config_error("kind: MUON muon { eps: 0 }", "optimizer.muon.eps = 0: must be > 0");
  expect_config_error("kind: MUON muon { iteration_dtype: FP16 }",
                      "optimizer.muon.iteration_dtype = FP16: must be FP32 or BF16");
  expect_config_error("kind: MUON muon { adamw_beta2: 1 }", "optimizer.muon.adamw_beta2 = 1: must be in [0, 1)");
  expect_config_error("kind: MUON muon { adamw_lr: -1 }", "optimizer.muon.adamw_lr = -1");
  expect_config_error("kind: MUON muon { adamw_weight_decay: -1 }", "optimizer.muon.adamw_weight_decay = -1");
  expect_config_error("muon { momentum: 0.9 }", "optimizer.muon: only for kind MUON (kind is ADAMW)");
  expect_config_error("kind: SGD muon { }", "optimizer.muon: only for kind MUON (kind is SGD)");
  expect_config_error("kind: MUON beta2: 0.95",
                      "Muon has no beta2; it is AdamW's and Lion's (its AdamW's are muon.adamw_beta1");
  expect_config_error("kind: MUON momentum: 0.9", "Muon's are muon.momentum and muon.nesterov");
  expect_config_error("kind: MUON weight_decay: -1", "optimizer.weight_decay = -1");
}

TEST(Optimizer, StepPlanClipsScalesAndSkips) {
  Optimizer opt(parse("grad_clip: 1.0 loss_scaling { init_scale: 1024 growth_interval: 2 } "
                      "schedule { warmup_steps: 2 }"));
  // Step 1: norm 10 > 1: clipped as clip_grad_norm_ does.
  StepPlan p = opt.plan_step(100.0, false, 4.0);
  EXPECT_FALSE(p.skip);
  EXPECT_DOUBLE_EQ(p.grad_norm, 10.0);
  EXPECT_DOUBLE_EQ(p.clip_coefficient, 1.0 / (10.0 + 1e-6));
  EXPECT_EQ(p.loss_scale, 1024.0);
  EXPECT_EQ(p.scalars.grad_multiplier, static_cast<float>(1.0 / (1024.0 * 4.0) / (10.0 + 1e-6)));
  EXPECT_EQ(p.scalars.step, 1);
  EXPECT_DOUBLE_EQ(p.lr, 0.5e-3);  // warmup: 1/2 of the peak
  // Step 2: overflow: skipped; the scale backs off; counters do not move.
  p = opt.plan_step(0.25, true, 4.0);
  EXPECT_TRUE(p.skip);
  EXPECT_EQ(p.scalars.found_inf, 1);
  EXPECT_EQ(p.loss_scale, 1024.0);
  EXPECT_EQ(opt.loss_scaler()->scale(), 512.0);
  EXPECT_EQ(opt.steps_done(), 1);
  EXPECT_EQ(opt.steps_skipped(), 1);
  // A non-finite norm is an overflow too.
  EXPECT_TRUE(opt.plan_step(std::numeric_limits<double>::infinity(), false).skip);
  EXPECT_EQ(opt.loss_scaler()->scale(), 256.0);
  // Step 2 again: small norm, no clipping; the step and lr the skipped one would have had.
  p = opt.plan_step(0.25, false, 1.0);
  EXPECT_EQ(p.scalars.step, 2);
  EXPECT_DOUBLE_EQ(p.lr, 1e-3);
  EXPECT_EQ(p.clip_coefficient, 1.0);
  EXPECT_EQ(p.scalars.grad_multiplier, 1.0f / 256);
  p = opt.plan_step(0.25, false, 1.0);
  EXPECT_EQ(opt.loss_scaler()->scale(), 512.0) << "grows after growth_interval good steps";
}

TEST(Optimizer, RangesFollowGroupsAndTheOneDimensionalRule) {
  const Optimizer opt(parse(R"(weight_decay: 0.1
                               param_groups { name_regex: "head\\..*" lr_scale: 0.5 }
                               param_groups { name_regex: "emb" weight_decay_scale: 0 })"));
  const std::vector<ShardParam> params{{"emb", 0, 100, 2},          {"h0.w", 100, 200, 2}, {"h0.b", 200, 210, 1},
                                       {"h0.ln.w", 216, 226, 1},    {"h1.w", 226, 300, 2}, {"head.w", 300, 350, 2}};
  const auto r = opt.ranges_for(params, 360);
  // emb (no decay by group) | h0.w | h0.b + padding + h0.ln.w (1-D) | h1.w | head.w (lr x 0.5) + tail padding
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(r[0].begin, 0);
  EXPECT_EQ(r[0].end, 100);
  EXPECT_EQ(r[0].weight_decay_scale, 0.0f);
  EXPECT_EQ(r[1].end, 200);
  EXPECT_EQ(r[1].weight_decay_scale, 1.0f);
  EXPECT_EQ(r[2].end, 226);
  EXPECT_EQ(r[2].weight_decay_scale, 0.0f);
  EXPECT_EQ(r[3].end, 300);
  EXPECT_EQ(r[4].end, 360);
  EXPECT_EQ(r[4].lr_scale, 0.5f);
  const Optimizer decay_all(parse("weight_decay_1d: true"));
  EXPECT_EQ(decay_all.ranges_for(params, 360).size(), 1u) << "everything decayed alike: one range";
  try {
    opt.ranges_for({{"a", 0, 10, 2}, {"b", 5, 20, 2}}, 20);
    ADD_FAILURE() << "overlap accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'b' at [5, 20) overlaps"), std::string::npos) << e.what();
  }
}

// Muon's matrices keep no AdamW second moment: each run of them (padding
// included, groups apart) leaves state1 but for its length modulo 64.
TEST(Optimizer, CompactStateLeavesOutTheSkippedRuns) {
  const Optimizer opt(parse(R"(kind: MUON param_groups { name_regex: "h0.w2" lr_scale: 0.5 })"));
  // emb | h0.w1 h0.w2 (skipped, two groups: one run of 200 + 4 + 96) | h0.b | h1.w (skipped, with the tail)
  const std::vector<ShardParam> params{{"emb", 0, 100, 2},
                                       {"h0.w1", 100, 300, 2, true},
                                       {"h0.w2", 304, 400, 2, true},
                                       {"h0.b", 400, 410, 1},
                                       {"h1.w", 410, 600, 2, true}};
  std::vector<UpdateRange> r = opt.ranges_for(params, 650);
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(compact_state1(r, 650), 650 - 256 - 192);
  const std::vector<int64_t> shifts{0, 0, 0, 256, 256};
  for (size_t k = 0; k < r.size(); ++k) EXPECT_EQ(r[k].state1_shift, shifts[k]) << "range " << k;
  EXPECT_EQ(compact_state1_numel(params, 650), 650 - 256 - 192) << "the plan's count, whatever the groups";
  std::vector<UpdateRange> none = opt.ranges_for({{"emb", 0, 100, 2}, {"b", 100, 110, 1}}, 128);
  EXPECT_EQ(compact_state1(none, 128), 128);
  for (const UpdateRange& x : none) EXPECT_EQ(x.state1_shift, 0);
}

// Two shards of one model, as two ranks would hold them: statistics per
// shard, summed, one plan, fused updates; against a float64 AdamW with the
// same clipping and loss scale, over 200 steps with a scripted overflow.
TEST(Optimizer, ClippedLossScaledAdamWOverTwoShardsFollowsFloat64) {
  Optimizer opt(parse("lr: 0.01 grad_clip: 0.5 loss_scaling { init_scale: 256 growth_interval: 50 }"));
  const int64_t n = 1000, half = 600;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> w(n), m(n, 0), v(n, 0);
  std::vector<uint16_t> copy(n);
  for (auto& x : w) x = normal(rng);
  std::vector<double> rw(w.begin(), w.end()), rm(n, 0), rv(n, 0);
  int64_t t_ref = 0;
  for (int step = 0; step < 200; ++step) {
    const double scale = opt.loss_scaler()->scale();
    std::vector<float> g(n);  // scaled gradients, as backward produces them
    for (auto& x : g) x = static_cast<float>(normal(rng) * 3 * scale);
    if (step == 40) g[123] = std::numeric_limits<float>::infinity();
    GradStats total;
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, half}, {half, n}}) {
      const GradStats s = grad_stats_cpu(g.data() + b, DType::kF32, e - b, static_cast<float>(opt.unscale_multiplier(1)));
      total.sum_sq += s.sum_sq;
      total.non_finite = total.non_finite || s.non_finite;
    }
    const StepPlan plan = opt.plan_step(total.sum_sq, total.non_finite);
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, half}, {half, n}}) {
      UpdateArgs a;
      a.n = e - b;
      a.master = w.data() + b;
      a.state0 = m.data() + b;
      a.state1 = v.data() + b;
      a.grad = g.data() + b;
      a.param_out = copy.data() + b;
      a.hyper = opt.hyper();
      fused_update_cpu(a, plan.scalars);
    }
    if (total.non_finite) continue;
    // float64 reference
    ++t_ref;
    double norm = 0;
    for (int64_t i = 0; i < n; ++i) norm += (g[i] / scale) * (g[i] / scale);
    norm = std::sqrt(norm);
    const double coef = std::min(1.0, 0.5 / (norm + 1e-6));
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i] / scale * coef;
      rw[i] *= 1 - 0.01 * 0.01;
      rm[i] = 0.9 * rm[i] + 0.1 * gi;
      rv[i] = 0.999 * rv[i] + 0.001 * gi * gi;
      const double bc1 = 1 - std::pow(0.9, t_ref), bc2 = 1 - std::pow(0.999, t_ref);
      rw[i] -= 0.01 / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + 1e-8);
    }
  }
  EXPECT_EQ(opt.steps_skipped(), 1);
  EXPECT_EQ(opt.steps_done(), 199);
  EXPECT_EQ(opt.loss_scaler()->scale(), 256.0 / 2 * 2 * 2 * 2) << "one backoff, three growths (steps 91, 141, 191)";
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(w[i] - rw[i]));
  // 199 steps of about 0.01 on |w| <= 2: fp32 rounding of a few 1e-7 per step.
  EXPECT_LT(worst, 2e-5);
}

}  // namespace
}  // namespace mp

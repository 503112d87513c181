// Loss scaler (GradScaler semantics, DeepSpeed hysteresis and min scale),
// learning-rate schedule and clip coefficient on scripted sequences with
// known answers.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/loss_scaler.h"
#include "optim/schedule.h"
#include "core/error.h"

namespace mp {
namespace {

TEST(LossScaler, DefaultsAreGradScalers) {
  LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  for (int i = 0; i < 1999; ++i) EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(false);  // the 2000th good step
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 65536.0);
}

TEST(LossScaler, FollowsAScriptedOverflowPattern) {
  LossScaler s({.init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
  // (found_inf, expected scale after, expected skip)
  const struct {
    bool inf;
    double scale;
  } script[] = {{false, 1024}, {false, 1024}, {false, 2048},  // grows after 3 good steps
                {true, 1024},                                 // backs off, tracker resets
                {false, 1024}, {false, 1024}, {true, 512},    // 2 good steps do not grow
                {false, 512},  {false, 512},  {false, 1024},  {true, 512}, {true, 256}};
  int skipped = 0;
  for (const auto& step : script) {
    EXPECT_EQ(s.update(step.inf), step.inf);
    skipped += step.inf;
    EXPECT_EQ(s.scale(), step.scale);
  }
  EXPECT_EQ(s.skipped_steps(), skipped);
  EXPECT_EQ(s.inverse_scale(), 1.0 / 256);
}

TEST(LossScaler, HysteresisAndMinScale) {
  LossScaler s({.init_scale = 8, .growth_interval = 2, .hysteresis = 2, .min_scale = 2});
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 8) << "the first overflow is tolerated";
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 4) << "the second backs off";
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 2);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 2) << "never below min_scale";
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 4);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 4) << "growth restored the hysteresis";
}

TEST(LossScaler, GrowthThatWouldOverflowIsRefusedAndBadOptionsNamed) {
  LossScaler s({.init_scale = 1e308, .growth_factor = 10, .growth_interval = 1});
  s.update(false);
  EXPECT_EQ(s.scale(), 1e308);
  try {
    LossScaler bad({.backoff_factor = 1.5});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("loss_scaler.backoff_factor = 1.5: must be in (0, 1)"), std::string::npos);
  }
  EXPECT_THROW(LossScaler({.hysteresis = 0}), ConfigError);
  EXPECT_THROW(LossScaler({.init_scale = 0}), ConfigError);
}

TEST(LrSchedule, WarmupCosineAndConstant) {
  LrSchedule s{1.0, 0.1, 10, 110};
  s.validate();
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(s.at(109), 0.1 + 0.45 * (1 + std::cos(M_PI * 99 / 100)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(100000), 0.1);
  const LrSchedule constant{3e-4, 0, 0, 0};
  EXPECT_DOUBLE_EQ(constant.at(0), 3e-4);
  EXPECT_DOUBLE_EQ(constant.at(123456), 3e-4);
  EXPECT_THROW((LrSchedule{1.0, 2.0, 0, 0}.validate()), ConfigError);
  EXPECT_THROW((LrSchedule{1.0, 0.0, 10, 5}.validate()), ConfigError);
}

TEST(Clip, MatchesClipGradNorm) {
  EXPECT_NEAR(clip_coefficient(10.0, 1.0), 1.0 / (10.0 + 1e-6), 1e-15);
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(1e9, 0.0), 1.0) << "max_norm 0 turns clipping off";
}

}  // namespace
}  // namespace mp

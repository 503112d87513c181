// The loss scaler (optim/loss_scaler.h): GradScaler semantics, DeepSpeed
// hysteresis and min scale on scripted overflow sequences with known
// answers, and bad options named.
#include <gtest/gtest.h>

#include "core/error.h"
#include "optim/loss_scaler.h"

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

}  // namespace
}  // namespace mp

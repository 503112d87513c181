// The learning-rate schedule and the clip coefficient (optim/schedule.h):
// warmup, cosine decay and constant rates with known answers; clipping as
// torch's clip_grad_norm_ computes it.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "optim/schedule.h"

namespace mp {
namespace {

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

// kernels/op_profile.h: what counts, where, and only once.
#include <gtest/gtest.h>

#include <thread>

#include "kernels/op_profile.h"

namespace mp {
namespace {

void busy(std::chrono::microseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
  }
}

class OpProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    op_profile_enable(true);
    (void)op_profile_take();
  }
  void TearDown() override {
    op_profile_enable(false);
    (void)op_profile_take();
  }
};

TEST_F(OpProfileTest, CountsOnlyTheOutermostOpInsideAModelCall) {
  {
    ScopedOp outside(OpFamily::kGelu);  // not in a model call: not counted
    busy(std::chrono::microseconds(200));
  }
  {
    ModelCallScope call;
    ScopedOp cast(OpFamily::kCast);
    busy(std::chrono::microseconds(500));
    ScopedOp inner(OpFamily::kGemm);  // nested: its time is the cast's
    busy(std::chrono::microseconds(500));
  }
  const OpProfile p = op_profile_take();
  EXPECT_EQ(p.calls[static_cast<size_t>(OpFamily::kCast)], 1);
  EXPECT_GE(p.seconds[static_cast<size_t>(OpFamily::kCast)], 1e-3);
  EXPECT_EQ(p.calls[static_cast<size_t>(OpFamily::kGemm)], 0);
  EXPECT_EQ(p.calls[static_cast<size_t>(OpFamily::kGelu)], 0);
  EXPECT_EQ(op_profile_take().total_s(), 0.0);  // taken: reset
}

TEST_F(OpProfileTest, AddsUpAcrossThreadsAndCostsNothingWhenOff) {
  auto work = [] {
    ModelCallScope call;
    ScopedOp op(OpFamily::kLayerNorm);
    busy(std::chrono::microseconds(300));
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  EXPECT_EQ(op_profile_take().calls[static_cast<size_t>(OpFamily::kLayerNorm)], 2);
  op_profile_enable(false);
  work();
  EXPECT_EQ(op_profile_take().total_s(), 0.0);
}

TEST(OpFamily, EveryFamilyHasAName) {
  for (int f = 0; f < kNumOpFamilies; ++f) EXPECT_NE(op_family_name(static_cast<OpFamily>(f)), "?");
}

}  // namespace
}  // namespace mp

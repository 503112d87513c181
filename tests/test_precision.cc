// Precision recipes and policies (runtime/precision.h): recipes expand as
// documented, overrides win, and invalid combinations say why.
#include <gtest/gtest.h>

#include <string>

#include "runtime/precision.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::contains;
using testing::error_of;
using PP = proto::PrecisionPolicy;

TEST(Precision, RecipesExpandAsDocumented) {
  const Precision fp32 = resolve_precision(precision_recipe("fp32"), false);
  EXPECT_EQ(fp32.param_dtype, DType::kF32);
  EXPECT_EQ(fp32.param_cast, ParamCast::kNone);
  const Precision amp = resolve_precision(precision_recipe("amp_bf16"), false);
  EXPECT_EQ(amp.param_dtype, DType::kBF16);
  EXPECT_EQ(amp.param_cast, ParamCast::kAtGather);
  EXPECT_EQ(amp.reduce_dtype, DType::kF32);
  const Precision master = resolve_precision(precision_recipe("bf16_master"), false);
  EXPECT_EQ(master.param_cast, ParamCast::kAtUpdate);
  EXPECT_EQ(master.reduce_dtype, DType::kBF16);
  EXPECT_EQ(master.reduce_accumulate, ReduceAccumulate::kFp32);
  const Precision rem = resolve_precision(precision_recipe("bf16_remainder"), false);
  EXPECT_EQ(rem.master, MasterMode::kBf16Remainder);
  const Precision pure = resolve_precision(precision_recipe("pure_bf16"), false);
  EXPECT_EQ(pure.master, MasterMode::kNone);
  EXPECT_EQ(pure.state_dtype, DType::kBF16);
  EXPECT_EQ(pure.rounding, Rounding::kStochastic);
  const Precision fp16 = resolve_precision(precision_recipe("amp_fp16"), false);
  EXPECT_EQ(fp16.loss_scaling, LossScalingMode::kDynamic);
  EXPECT_TRUE(resolve_precision(precision_recipe("tf32"), false).tf32_matmul);
  // Overrides win over the recipe.
  PP p = precision_recipe("amp_bf16");
  p.set_reduce_dtype(proto::BF16);
  p.set_param_cast(PP::CAST_AT_UPDATE);
  const Precision o = resolve_precision(p, false);
  EXPECT_EQ(o.reduce_dtype, DType::kBF16);
  EXPECT_EQ(o.param_cast, ParamCast::kAtUpdate);
  EXPECT_EQ(error_of([] { precision_recipe("bf8"); }),
            "precision recipe 'bf8' is unknown; recipes: fp32, tf32, amp_bf16, bf16_master, bf16_remainder, "
            "pure_bf16, amp_fp16");
}

TEST(Precision, InvalidCombinationsSayWhy) {
  PP fp16;
  fp16.set_param_dtype(proto::FP16);
  EXPECT_EQ(error_of([&] { resolve_precision(fp16, false); }),
            "precision (recipe fp32): param_dtype FP16 needs loss_scaling STATIC or DYNAMIC: fp16 gradients "
            "underflow without it");
  EXPECT_NO_THROW(resolve_precision(fp16, true));  // optimizer.loss_scaling present: dynamic
  PP rem;
  rem.set_master(PP::MASTER_BF16_REMAINDER);
  EXPECT_EQ(error_of([&] { resolve_precision(rem, false); }),
            "precision (recipe fp32): master BF16_REMAINDER needs param_dtype BF16 (the master is the bf16 param "
            "plus a 16-bit remainder), not fp32");
  PP sr;
  sr.set_rounding(PP::STOCHASTIC);
  EXPECT_TRUE(contains(error_of([&] { resolve_precision(sr, false); }), "rounding STOCHASTIC needs a 16-bit param_dtype"));
  PP none = precision_recipe("amp_fp16");
  none.set_loss_scaling(PP::LOSS_SCALING_NONE);
  EXPECT_TRUE(contains(error_of([&] { resolve_precision(none, false); }), "param_dtype FP16 needs loss_scaling"));
  EXPECT_EQ(error_of([&] { resolve_precision(none, true); }),
            "precision.loss_scaling = NONE contradicts optimizer.loss_scaling, which is set");
  PP state = precision_recipe("bf16_master");
  state.set_state_dtype(proto::FP16);
  EXPECT_TRUE(contains(error_of([&] { resolve_precision(state, false); }), "optimizer state is FP32 or BF16"));
  PP cast = precision_recipe("pure_bf16");
  cast.set_param_cast(PP::CAST_AT_GATHER);
  EXPECT_TRUE(contains(error_of([&] { resolve_precision(cast, false); }), "param_cast needs master FP32"));
}

}  // namespace
}  // namespace mp

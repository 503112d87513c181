// Flat layout, precision recipes, engine options and the memory plan:
// everything the engine decides before it runs, on one process.
#include <gtest/gtest.h>

#include "runtime/engine_options.h"
#include "models/flat_layout.h"
#include "runtime/memory_plan.h"
#include "runtime/precision.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::contains;
using testing::error_of;
using PP = proto::PrecisionPolicy;
using SC = proto::ShardingConfig;

ModelSpec two_units() {
  ModelSpec m;
  m.units.push_back(UnitSpec{"a", {ParamSpec{"a.w", {3, 5}, {}}, ParamSpec{"a.b", {3}, {}}}});
  m.units.push_back(UnitSpec{"b", {ParamSpec{"b.w", {7}, {}}}});
  return m;
}

TEST(FlatLayout, AlignsParamsAndPadsToTheGroupSize) {
  const FlatLayout l(two_units(), 3);
  const UnitLayout& a = l.unit(0);
  EXPECT_EQ(a.params[0].offset, 0);
  EXPECT_EQ(a.params[1].offset, 16);  // 15 rounded up to a multiple of 8
  EXPECT_EQ(a.numel, 19);
  EXPECT_EQ(a.padded_numel, 21);
  EXPECT_EQ(a.shard_numel, 7);
  EXPECT_EQ(l.unit(1).padded_numel, 9);
  EXPECT_EQ(l.total_numel(), 25);
  EXPECT_EQ(l.max_padded_numel(), 21);
  EXPECT_EQ(l.param("b.w").unit, 1);
  // Offsets do not depend on the group size; only the padding does.
  const FlatLayout l4(two_units(), 4);
  EXPECT_EQ(l4.unit(0).params[1].offset, 16);
  EXPECT_EQ(l4.unit(0).padded_numel, 20);
}

TEST(FlatLayout, BadModelsAreNamed) {
  ModelSpec dup = two_units();
  dup.units[1].params[0].name = "a.w";
  EXPECT_EQ(error_of([&] { FlatLayout(dup, 1); }), "parameter name 'a.w' appears twice");
  ModelSpec empty_unit = two_units();
  empty_unit.units[1].params.clear();
  EXPECT_EQ(error_of([&] { FlatLayout(empty_unit, 1); }), "unit 'b' has no parameters");
  ModelSpec negative = two_units();
  negative.units[0].params[0].shape = {3, -5};
  EXPECT_TRUE(contains(error_of([&] { FlatLayout(negative, 1); }), "parameter 'a.w' shape [3, -5]"));
  EXPECT_EQ(error_of([&] { FlatLayout(ModelSpec{}, 1); }), "model has no units");
  EXPECT_EQ(error_of([&] { FlatLayout(two_units(), 2).param("c"); }), "no parameter named 'c'");
}

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

TEST(EngineOptions, StrategiesResolveGroups) {
  proto::EngineConfig c;
  EXPECT_EQ(resolve_engine_options(c, 8).shard_size, 8);  // FULL_SHARD by default
  c.mutable_sharding()->set_strategy(SC::NO_SHARD);
  EXPECT_EQ(resolve_engine_options(c, 8).shard_size, 1);
  EXPECT_EQ(resolve_engine_options(c, 8).replicate_size, 8);
  c.mutable_sharding()->set_strategy(SC::HYBRID_SHARD);
  c.mutable_sharding()->set_hybrid_shard_size(4);
  const EngineOptions h = resolve_engine_options(c, 8);
  EXPECT_EQ(h.shard_size, 4);
  EXPECT_EQ(h.replicate_size, 2);
  EXPECT_EQ(h.gather_slots(10), 2);  // prefetch 1 + the unit being computed
  EXPECT_EQ(parse_strategy("shard_grad_op"), SC::SHARD_GRAD_OP);
  EXPECT_TRUE(contains(error_of([] { parse_strategy("zero4"); }), "strategy 'zero4' is unknown"));
}

TEST(EngineOptions, BadConfigsNameTheField) {
  proto::EngineConfig c;
  c.mutable_sharding()->set_strategy(SC::HYBRID_SHARD);
  c.mutable_sharding()->set_hybrid_shard_size(3);
  EXPECT_EQ(error_of([&] { resolve_engine_options(c, 4); }),
            "sharding.hybrid_shard_size = 3 does not divide the world size 4");
  c.mutable_sharding()->set_strategy(SC::FULL_SHARD);
  EXPECT_TRUE(contains(error_of([&] { resolve_engine_options(c, 4); }), "it applies to HYBRID_SHARD only"));
  proto::EngineConfig d;
  d.set_deterministic(true);
  *d.mutable_precision() = precision_recipe("bf16_master");
  EXPECT_EQ(error_of([&] { resolve_engine_options(d, 2); }),
            "deterministic needs precision.reduce_dtype FP32 (every micro-batch's fp32 gradient is summed in "
            "fp64); it is bf16");
  proto::EngineConfig ib;
  ib.mutable_sharding()->set_optimizer_in_backward(true);
  ib.mutable_optimizer()->set_grad_clip(1.0);
  EXPECT_TRUE(contains(error_of([&] { resolve_engine_options(ib, 2); }), "needs optimizer.grad_clip = 0"));
  proto::EngineConfig hook;
  hook.mutable_comm()->set_comm_hook("bf16_compress");
  EXPECT_TRUE(contains(error_of([&] { resolve_engine_options(hook, 2); }), "applies to NO_SHARD"));
  proto::EngineConfig mb;
  mb.set_micro_batches(-2);
  EXPECT_EQ(error_of([&] { resolve_engine_options(mb, 2); }), "micro_batches = -2: must be positive");
  proto::EngineConfig pf;
  pf.mutable_sharding()->set_prefetch_depth(-1);
  EXPECT_EQ(error_of([&] { resolve_engine_options(pf, 2); }), "sharding.prefetch_depth = -1: must be in [0, 64]");
  proto::EngineConfig opt;
  opt.mutable_optimizer()->set_beta2(1.5);
  EXPECT_TRUE(contains(error_of([&] { resolve_engine_options(opt, 2); }), "optimizer.beta2 = 1.5"));
}

// 24 equal units of 8192 x 6144 (1.2B parameters) planned for 1024 ranks:
// the bytes per parameter follow the strategy table (REFERENCE.md).
TEST(MemoryPlan, MatchesTheStrategyTableAtScale) {
  ModelSpec m;
  for (int u = 0; u < 24; ++u) {
    const std::string name = "block" + std::to_string(u);
    m.units.push_back(UnitSpec{name, {ParamSpec{name + ".w", {8192, 6144}, {}}}});
  }
  auto plan = [&](Strategy s, const std::string& recipe) {
    proto::EngineConfig c;
    c.mutable_sharding()->set_strategy(s);
    *c.mutable_precision() = precision_recipe(recipe);
    return plan_memory(m, c, 1024);
  };
  const double P = 24.0 * 8192 * 6144, N = 1024, unit = 8192.0 * 6144;
  // NO_SHARD, fp32: master 4 + moments 8 + gradient 4 (+ two fp32 backward buffers of one unit).
  const MemoryPlan ddp = plan(SC::NO_SHARD, "fp32");
  EXPECT_DOUBLE_EQ(ddp.bytes_per_param(MemCategory::kMaster), 4.0);
  EXPECT_DOUBLE_EQ(ddp.bytes_per_param(MemCategory::kOptimizerState), 8.0);
  EXPECT_DOUBLE_EQ(ddp.bytes_per_param(MemCategory::kGradient), 4.0 + 8.0 * unit / P);
  // FULL_SHARD, bf16_master: 16/N + two gathered bf16 units + backward buffers.
  const MemoryPlan z3 = plan(SC::FULL_SHARD, "bf16_master");
  EXPECT_DOUBLE_EQ(z3.bytes_per_param(MemCategory::kMaster), 4.0 / N);
  EXPECT_DOUBLE_EQ(z3.bytes_per_param(MemCategory::kParamShards), 2.0 / N);
  EXPECT_DOUBLE_EQ(z3.bytes_per_param(MemCategory::kOptimizerState), 8.0 / N);
  EXPECT_DOUBLE_EQ(z3.bytes_per_param(MemCategory::kGatheredParams), 2 * 2.0 * unit / P);
  EXPECT_DOUBLE_EQ(static_cast<double>(z3.at(MemCategory::kGradient)), 4.0 * P / N + 8.0 * unit);
  // SHARD_GRAD_OP keeps the full bf16 params: 2 + 14/N.
  const MemoryPlan z2 = plan(SC::SHARD_GRAD_OP, "bf16_master");
  EXPECT_DOUBLE_EQ(z2.bytes_per_param(MemCategory::kGatheredParams), 2.0);
  // bf16_remainder: master 2/N + param shard 2/N, fp32-exact in 4 bytes.
  const MemoryPlan rem = plan(SC::FULL_SHARD, "bf16_remainder");
  EXPECT_DOUBLE_EQ(rem.bytes_per_param(MemCategory::kMaster) + rem.bytes_per_param(MemCategory::kParamShards),
                   4.0 / N);
  // amp_bf16 keeps no bf16 shard: it casts into one unit's shard of scratch.
  const MemoryPlan amp = plan(SC::FULL_SHARD, "amp_bf16");
  EXPECT_EQ(amp.at(MemCategory::kParamShards), 0u);
  EXPECT_DOUBLE_EQ(static_cast<double>(amp.at(MemCategory::kCommScratch)), 2.0 * unit / N);
  EXPECT_TRUE(contains(amp.to_string(), "param_shards"));
}

}  // namespace
}  // namespace mp

// The memory plan (runtime/memory_plan.h): bytes per parameter of each
// category follow the strategy table at scale.
#include <gtest/gtest.h>

#include <string>

#include "runtime/engine_options.h"
#include "runtime/memory_plan.h"
#include "runtime/precision.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::contains;
using SC = proto::ShardingConfig;

// 24 equal units of 8192 x 6144 (1.2B parameters) planned for 1024 ranks:
// the bytes per parameter follow the strategy table (docs/engine.md "Sharding strategies").
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

// The host snapshot of an asynchronous checkpoint save is the image of the
// file the rank writes: its shard's stored fields, split among replicas,
// after a 64-byte header (these chunks need no padding), in whole 4 KiB
// pages; the plan shows it on its own line only when set.
TEST(MemoryPlan, CheckpointSnapshotIsTheStoredPartOfTheShard) {
  ModelSpec m;
  for (int u = 0; u < 4; ++u) {
    const std::string name = "block" + std::to_string(u);
    m.units.push_back(UnitSpec{name, {ParamSpec{name + ".w", {1024, 768}, {}}}});
  }
  auto options = [&](Strategy s, const std::string& recipe, int world) {
    proto::EngineConfig c;
    c.mutable_sharding()->set_strategy(s);
    *c.mutable_precision() = precision_recipe(recipe);
    return resolve_engine_options(c, world);
  };
  auto image = [](size_t field_bytes) { return (field_bytes + 64 + 4095) / 4096 * 4096; };
  for (const std::string recipe : {"fp32", "bf16_master", "bf16_remainder", "pure_bf16"}) {
    SCOPED_TRACE(recipe);
    const EngineOptions z3 = options(SC::FULL_SHARD, recipe, 8);
    const MemoryPlan p = plan_memory(m, z3);
    EXPECT_EQ(plan_checkpoint_snapshot(m, z3),
              image(p.at(MemCategory::kMaster) + p.at(MemCategory::kParamShards) + p.at(MemCategory::kOptimizerState)));
    // NO_SHARD on 8 ranks: every rank holds the whole state and writes an eighth.
    const EngineOptions ddp = options(SC::NO_SHARD, recipe, 8);
    const MemoryPlan q = plan_memory(m, ddp);
    EXPECT_EQ(plan_checkpoint_snapshot(m, ddp),
              image((q.at(MemCategory::kMaster) + q.at(MemCategory::kParamShards) +
                     q.at(MemCategory::kOptimizerState)) / 8));
  }
  MemoryPlan p = plan_memory(m, options(SC::FULL_SHARD, "bf16_master", 8));
  EXPECT_FALSE(contains(p.to_string(), "checkpoint snapshot"));
  p.checkpoint_snapshot_bytes = plan_checkpoint_snapshot(m, options(SC::FULL_SHARD, "bf16_master", 8));
  EXPECT_TRUE(contains(p.to_string(), "(checkpoint snapshot, host)"));
}

}  // namespace
}  // namespace mp

// The memory plan (runtime/memory_plan.h): bytes per parameter of each
// category follow the strategy table at scale.
#include <gtest/gtest.h>

#include <string>

#include "runtime/comm_volume.h"
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

// Note [Communication volume] on 4 units of 1024 parameters (8 ranks, so
// no padding), every strategy, against the ring counts written out.
TEST(CommVolume, CountsEachCollectiveAsARingSendsIt) {
  ModelSpec m;
  for (int u = 0; u < 4; ++u) {
    const std::string name = "u" + std::to_string(u);
    m.units.push_back(UnitSpec{name, {ParamSpec{name + ".w", {1024}, {}}}, /*backward_reads_params=*/u != 0});
  }
  m.units[2].recomputable = true;
  m.units[0].recomputable = true;
  auto volume = [&](Strategy s, int micro_batches, int every = 0, int world = 8) {
    proto::EngineConfig c;
    c.mutable_sharding()->set_strategy(s);
    if (s == SC::HYBRID_SHARD) c.mutable_sharding()->set_hybrid_shard_size(4);
    *c.mutable_precision() = precision_recipe("bf16_master");  // bf16 params and reductions
    c.set_micro_batches(micro_batches);
    if (every > 0) c.mutable_activation_checkpointing()->set_policy(proto::ActivationCheckpointing::EVERY_UNIT);
    return plan_comm_volume(m, resolve_engine_options(c, world));
  };
  const double unit = 1024 * 2.0, all = 4 * unit, ring8 = 7.0 / 8;
  // NO_SHARD: one all-reduce of every gradient.
  EXPECT_DOUBLE_EQ(volume(SC::NO_SHARD, 2).total(), 2 * ring8 * all);
  // SHARD_OPTIMIZER: one reduce-scatter (full accumulators) and one all-gather.
  EXPECT_DOUBLE_EQ(volume(SC::SHARD_OPTIMIZER, 2).reduce_bytes, ring8 * all);
  EXPECT_DOUBLE_EQ(volume(SC::SHARD_OPTIMIZER, 2).gather_bytes, ring8 * all);
  // SHARD_GRAD_OP: a reduce-scatter per micro-batch, one all-gather.
  EXPECT_DOUBLE_EQ(volume(SC::SHARD_GRAD_OP, 2).reduce_bytes, 2 * ring8 * all);
  EXPECT_DOUBLE_EQ(volume(SC::SHARD_GRAD_OP, 2).gather_bytes, ring8 * all);
  // FULL_SHARD, prefetch depth 1 (a ring of 2): the first micro-batch's
  // forward gathers 4 units, the second's the 2 not left in the ring; each
  // backward the units 0 and 1 not left by the forward, but unit 0 reads
  // no parameters, unless it is recomputed.
  EXPECT_DOUBLE_EQ(volume(SC::FULL_SHARD, 2).gather_bytes, ring8 * unit * (4 + 2 + 2 * 1));
  EXPECT_DOUBLE_EQ(volume(SC::FULL_SHARD, 2, 1).gather_bytes, ring8 * unit * (4 + 2 + 2 * 2));
  EXPECT_DOUBLE_EQ(volume(SC::FULL_SHARD, 2).reduce_bytes, 2 * ring8 * all);
  // HYBRID_SHARD over groups of 4: the same in the group, then each
  // shard (a quarter) all-reduced across the 2 replicas.
  const CommVolume h = volume(SC::HYBRID_SHARD, 1);
  EXPECT_DOUBLE_EQ(h.gather_bytes, 0.75 * unit * (4 + 1));  // one micro-batch: forward 4, backward unit 1
  EXPECT_DOUBLE_EQ(h.reduce_bytes, 0.75 * all);
  EXPECT_DOUBLE_EQ(h.replicate_bytes, 2 * 0.5 * all / 4);
  // One rank sends nothing.
  EXPECT_EQ(volume(SC::FULL_SHARD, 2, 0, 1).total(), 0.0);
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

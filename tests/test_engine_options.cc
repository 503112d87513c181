// Engine options (runtime/engine_options.h): strategies resolve the shard
// and replica groups, and bad engine configs name the field.
#include <gtest/gtest.h>

#include <string>

#include "models/flat_layout.h"
#include "runtime/engine_options.h"
#include "runtime/precision.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::contains;
using testing::error_of;
using SC = proto::ShardingConfig;

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

// activation_checkpointing: NONE, EVERY_UNIT and EVERY_KTH_UNIT as
// recomputed_units' k, and the units that k picks.
TEST(EngineOptions, ActivationCheckpointingPicksEveryKthRecomputableUnit) {
  using AC = proto::ActivationCheckpointing;
  proto::ActivationCheckpointing a;
  EXPECT_EQ(recompute_every(a), 0);
  a.set_policy(AC::EVERY_UNIT);
  EXPECT_EQ(recompute_every(a), 1);
  a.set_policy(AC::EVERY_KTH_UNIT);
  a.set_every(3);
  EXPECT_EQ(recompute_every(a), 3);
  a.set_every(1);
  EXPECT_EQ(error_of([&] { recompute_every(a); }),
            "activation_checkpointing.every = 1: EVERY_KTH_UNIT needs k >= 2 (EVERY_UNIT is k = 1)");
  a.set_policy(AC::EVERY_UNIT);
  a.set_every(2);
  EXPECT_EQ(error_of([&] { recompute_every(a); }),
            "activation_checkpointing.every = 2 is set but policy is EVERY_UNIT; it applies to EVERY_KTH_UNIT");

  ModelSpec spec;
  for (int u = 0; u < 7; ++u) spec.units.push_back(UnitSpec{"u" + std::to_string(u), {}, true, u >= 1 && u <= 5});
  EXPECT_EQ(recomputed_units(spec, 0), std::vector<bool>(7, false));
  EXPECT_EQ(recomputed_units(spec, 1), (std::vector<bool>{false, true, true, true, true, true, false}));
  EXPECT_EQ(recomputed_units(spec, 2), (std::vector<bool>{false, true, false, true, false, true, false}));
  EXPECT_EQ(recomputed_units(spec, 5), (std::vector<bool>{false, true, false, false, false, false, false}));
  for (UnitSpec& u : spec.units) u.recomputable = false;
  EXPECT_EQ(error_of([&] { recomputed_units(spec, 1); }),
            "activation_checkpointing is on, but the model can recompute none of its 7 units "
            "(UnitSpec::recomputable): turn it off for this model");
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
  proto::EngineConfig q;
  q.mutable_sharding()->set_strategy(proto::ShardingConfig::SHARD_GRAD_OP);
  q.mutable_sharding()->set_int8_param_gather(true);
  EXPECT_TRUE(contains(error_of([&] { resolve_engine_options(q, 2); }), "int8_param_gather applies to FULL_SHARD"));
  q.mutable_sharding()->set_strategy(proto::ShardingConfig::FULL_SHARD);
  q.set_deterministic(true);
  q.mutable_precision()->set_reduce_dtype(proto::FP32);
  EXPECT_TRUE(contains(error_of([&] { resolve_engine_options(q, 2); }), "turn off sharding.int8_param_gather"));
  proto::EngineConfig mb;
  mb.set_micro_batches(-2);
  EXPECT_EQ(error_of([&] { resolve_engine_options(mb, 2); }), "micro_batches = -2: must be positive");
  proto::EngineConfig pf;
  pf.mutable_sharding()->set_prefetch_depth(-1);
  EXPECT_EQ(error_of([&] { resolve_engine_options(pf, 2); }), "sharding.prefetch_depth = -1: must be in [0, 64]");
  proto::EngineConfig opt;
  opt.mutable_optimizer()->set_beta2(1.5);
  EXPECT_TRUE(contains(error_of([&] { resolve_engine_options(opt, 2); }), "optimizer.beta2 = 1.5"));
  proto::EngineConfig muon;
  muon.mutable_optimizer()->set_kind(proto::OptimizerConfig::MUON);
  EXPECT_NO_THROW(resolve_engine_options(muon, 2));  // the engine runs it (runtime/muon_exchange.h)
  muon.mutable_sharding()->set_optimizer_in_backward(true);  // overlapped (Note [Muon overlapped])
  EXPECT_NO_THROW(resolve_engine_options(muon, 2));
  muon.mutable_precision()->set_state_dtype(proto::BF16);  // its matrices' momentum is fp32
  EXPECT_TRUE(contains(error_of([&] { resolve_engine_options(muon, 2); }),
                       "optimizer.kind = MUON keeps its matrices' momentum in the fp32 optimizer state"));
  muon.mutable_precision()->set_master(proto::PrecisionPolicy::MASTER_NONE);
  EXPECT_TRUE(contains(error_of([&] { resolve_engine_options(muon, 2); }), "optimizer.kind = MUON needs a master"));
}

}  // namespace
}  // namespace mp

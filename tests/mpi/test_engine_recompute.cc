// Activation recomputation (Note [Activation recomputation] in
// models/model.h) under mpirun: the same bits as keeping the activations,
// for every strategy and policy; the memory plan still equals what is
// measured; the engine and the model must agree on the units.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "tests/mpi/engine_test_util.h"
#include "tests/mpi/mpi_test.h"
#include "tests/test_util.h"

namespace mp::testing {
namespace {

using SC = proto::ShardingConfig;
using AC = proto::ActivationCheckpointing;

class EngineRecomputeTest : public EngineWorldTest {
 protected:
  EngineRecomputeTest() : EngineWorldTest("recompute") {}
};

// Three blocks, so that every 2nd block leaves one block keeping its activations.
GptConfig three_blocks() { return gpt_config(50, 8, 16, 2, 3, 2); }

proto::EngineConfig with_policy(proto::EngineConfig c, int every) {
  if (every == 1) c.mutable_activation_checkpointing()->set_policy(AC::EVERY_UNIT);
  if (every >= 2) {
    c.mutable_activation_checkpointing()->set_policy(AC::EVERY_KTH_UNIT);
    c.mutable_activation_checkpointing()->set_every(every);
  }
  return c;
}

TrainRun train_gpt(Communicator& world, const proto::EngineConfig& c, const GptConfig& g, int steps) {
  GptOptions o;
  o.recompute_every = resolve_engine_options(c, world.size()).recompute_every;
  Gpt model(g, Allocator(), nullptr, o);
  return train(world, c, model, steps);
}

// Recomputing every block, or every 2nd, gives the losses, norms and
// weights of keeping every activation, bit for bit: under every strategy,
// recipe and micro-batch count, deterministic or not.
TEST_F(EngineRecomputeTest, RecomputationChangesNoBit) {
  const int n = size();
  for (Strategy s : all_strategies()) {
    for (const std::string recipe : {"fp32", "bf16_master", "amp_bf16"}) {
      for (int deterministic = 0; deterministic < 2; ++deterministic) {
        if (deterministic && recipe != "fp32") continue;  // it needs fp32 reductions
        SCOPED_TRACE(recipe + " " + std::string(strategy_name(s)) + (deterministic ? " deterministic" : ""));
        proto::EngineConfig base = engine_config(s, recipe, n, 2);
        base.set_deterministic(deterministic != 0);
        base.mutable_optimizer()->set_grad_clip(1.0);
        const TrainRun ref = train_gpt(*world_, base, three_blocks(), 3);
        for (int every : {1, 2}) {
          SCOPED_TRACE("recompute every " + std::to_string(every));
          const TrainRun r = train_gpt(*world_, with_policy(base, every), three_blocks(), 3);
          EXPECT_EQ(r.losses, ref.losses);
          EXPECT_EQ(r.norms, ref.norms);
          EXPECT_TRUE(same_bits(r.weights, ref.weights));
        }
      }
    }
  }
}

// Every byte the engine and the model allocate is planned: the engine's
// categories by its plan, the activations by Gpt::activation_bytes for the
// same policy, which recomputation makes smaller.
TEST_F(EngineRecomputeTest, PlannedMemoryEqualsMeasured) {
  const int n = size();
  const GptConfig g = gpt_config(50, 32, 32, 2, 4, 2);
  size_t activations[3] = {0, 0, 0};
  for (Strategy s : all_strategies()) {
    for (int every : {0, 1, 2}) {
      SCOPED_TRACE(std::string(strategy_name(s)) + " recompute every " + std::to_string(every));
      const proto::EngineConfig c = with_policy(engine_config(s, "amp_bf16", n, 2), every);
      GptOptions o;
      o.recompute_every = every;
      Allocator alloc;
      Gpt model(g, alloc, nullptr, o);
      Engine engine(model.spec(), c, *world_, alloc);
      for (int step = 0; step < 2; ++step) engine.step(model);
      const MemStats measured = alloc.stats();
      const MemoryPlan plan = engine.plan();
      for (int k = 0; k < kNumMemCategories; ++k) {
        const auto cat = static_cast<MemCategory>(k);
        if (cat == MemCategory::kOther) continue;
        const size_t planned = cat == MemCategory::kActivations
                                   ? static_cast<size_t>(Gpt::activation_bytes(g, Device::cpu(), o))
                                   : plan.at(cat);
        EXPECT_EQ(measured.current(cat), planned) << mem_category_name(cat);
        EXPECT_EQ(measured.peak(cat), planned) << mem_category_name(cat) << " peak";
      }
      activations[every] = measured.current(MemCategory::kActivations);
    }
  }
  EXPECT_LT(activations[1], activations[2]);
  EXPECT_LT(activations[2], activations[0]);
}

// The MLP, with its hidden unit marked recomputable: the engine calls
// recompute just before that unit's backward, with the very parameters the
// forward had (a checksum of their bytes), once per micro-batch.
class RecomputingMlp final : public HostModel {
 public:
  RecomputingMlp() : inner_(small_mlp()), spec_(inner_.spec()) { spec_.units[1].recomputable = true; }
  const ModelSpec& spec() const override { return spec_; }
  bool recomputes(int unit) const override { return unit == 1; }
  void begin_micro_batch(int64_t g) override { inner_.begin_micro_batch(g); }
  void forward(int unit, const Tensor& params) override {
    if (unit == 1) forward_sum_ = checksum(params);
    inner_.forward(unit, params);
  }
  double loss() const override { return inner_.loss(); }
  void recompute(int unit, const Tensor& params) override {
    EXPECT_EQ(unit, 1);
    EXPECT_EQ(last_backward_, 2) << "recompute(1) must follow backward(2)";
    EXPECT_EQ(checksum(params), forward_sum_) << "recompute got other parameters than the forward";
    ++recomputes_;
  }
  void backward(int unit, const Tensor& params, const Tensor& grads) override {
    if (unit == 1) {
      EXPECT_EQ(recomputes_, ++backwards_of_1_) << "backward(1) without recompute(1) before it";
    }
    last_backward_ = unit;
    inner_.backward(unit, params, grads);
  }
  int recomputes() const { return recomputes_; }

 private:
  static uint32_t checksum(const Tensor& t) {
    return crc32c(std::string_view(static_cast<const char*>(t.data()),
                                   static_cast<size_t>(t.numel()) * dtype_size(t.dtype())));
  }
  Mlp inner_;
  ModelSpec spec_;
  uint32_t forward_sum_ = 0;
  int recomputes_ = 0, backwards_of_1_ = 0, last_backward_ = -1;
};

TEST_F(EngineRecomputeTest, AHostModelRecomputesWhatItSaysWithTheForwardsParameters) {
  const int n = size();
  for (Strategy s : all_strategies()) {
    SCOPED_TRACE(strategy_name(s));
    const proto::EngineConfig base = engine_config(s, "bf16_master", n, 2);
    const TrainRun ref = train(*world_, base, small_mlp(), 3);
    RecomputingMlp model;
    const TrainRun r = train(*world_, with_policy(base, 1), model, 3);
    EXPECT_EQ(model.recomputes(), 3 * 2);
    EXPECT_EQ(r.losses, ref.losses);
    EXPECT_TRUE(same_bits(r.weights, ref.weights));
  }
}

// The engine's policy and the model's must match, and a model that can
// recompute nothing refuses the policy: ConfigErrors that name the unit or
// the reason, before any step runs.
TEST_F(EngineRecomputeTest, APolicyTheModelDoesNotFollowIsAConfigError) {
  const int n = size();
  const proto::EngineConfig none = engine_config(SC::FULL_SHARD, "fp32", n, 1);
  {
    GptOptions o;
    o.recompute_every = 1;
    Gpt model(three_blocks(), Allocator(), nullptr, o);
    Engine engine(model.spec(), none, *world_);
    EXPECT_PRED2(contains, error_of<ConfigError>([&] { engine.step(model); }),
                 "unit 'h0': engine.activation_checkpointing keeps its activations, but the model recomputes them");
  }
  {
    Gpt model(three_blocks());
    Engine engine(model.spec(), with_policy(none, 2), *world_);
    EXPECT_PRED2(contains, error_of<ConfigError>([&] { engine.step(model); }),
                 "unit 'h0': engine.activation_checkpointing recomputes its activations, but the model keeps them");
  }
  Mlp mlp(small_mlp());
  EXPECT_PRED2(contains, error_of<ConfigError>([&] { Engine engine(mlp.spec(), with_policy(none, 1), *world_); }),
               "activation_checkpointing is on, but the model can recompute none of its 3 units");
}

}  // namespace
}  // namespace mp::testing

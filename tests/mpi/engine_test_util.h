// tests/mpi/engine_test_util.h: configs and runs shared by the engine tests.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/gpt.h"
#include "models/mlp.h"
#include "runtime/engine.h"
#include "runtime/precision.h"
#include "tests/model_test_util.h"
#include "tests/mpi/comm_test_util.h"
#include "tests/mpi/mpi_test.h"
#include "tests/test_util.h"

namespace mp::testing {

// The engine tests' fixture: the world (world_) and each rank alone (self_)
// as communicators of the test's own, released before the harness agrees.
class EngineWorldTest : public MpiTest {
 protected:
  explicit EngineWorldTest(std::string name) : name_(std::move(name)) {}
  void SetUp() override {
    MpiTest::SetUp();
    world_ = make_world(name_);
    self_ = world_->split(world_->rank(), 0, "self");
  }
  void TearDown() override {
    self_.reset();
    world_.reset();
    MpiTest::TearDown();
  }

  std::unique_ptr<Communicator> world_;
  std::unique_ptr<Communicator> self_;

 private:
  std::string name_;
};

inline const std::vector<Strategy>& all_strategies() {
  static const std::vector<Strategy> s = {proto::ShardingConfig::NO_SHARD, proto::ShardingConfig::SHARD_OPTIMIZER,
                                          proto::ShardingConfig::SHARD_GRAD_OP, proto::ShardingConfig::FULL_SHARD,
                                          proto::ShardingConfig::HYBRID_SHARD};
  return s;
}

// HYBRID_SHARD groups: 2 where the world divides, else 1 (pure replication).
inline int hybrid_size_for(int world) { return world % 2 == 0 ? 2 : 1; }

inline proto::EngineConfig engine_config(Strategy strategy, const std::string& recipe, int world, int micro_batches) {
  proto::EngineConfig c;
  c.mutable_sharding()->set_strategy(strategy);
  if (strategy == proto::ShardingConfig::HYBRID_SHARD) c.mutable_sharding()->set_hybrid_shard_size(hybrid_size_for(world));
  *c.mutable_precision() = precision_recipe(recipe);
  c.mutable_optimizer()->set_kind(proto::OptimizerConfig::ADAMW);
  c.mutable_optimizer()->set_lr(1e-2);
  c.mutable_optimizer()->set_weight_decay(0.1);
  c.set_micro_batches(micro_batches);
  c.set_seed(7);
  return c;
}

// Every unit's master weights, gathered whole.
inline std::vector<std::vector<float>> all_weights(Engine& engine) {
  std::vector<std::vector<float>> w;
  for (int u = 0; u < engine.layout().num_units(); ++u) w.push_back(engine.gather_master(u));
  return w;
}

// This rank's shard of every unit's master weights.
inline std::vector<std::vector<float>> master_shards(const Engine& engine) {
  std::vector<std::vector<float>> s;
  for (int u = 0; u < engine.layout().num_units(); ++u) s.push_back(engine.master_shard(u));
  return s;
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<double> norms;
  std::vector<std::vector<float>> weights;  // per unit, full, after the last step
  MemStats memory;
  MemoryPlan plan;
};

// The two test models: small_mlp() and small_gpt() (tests/model_test_util.h).
enum class TestModel { kMlp, kGpt };
inline const char* test_model_name(TestModel m) { return m == TestModel::kMlp ? "mlp" : "gpt"; }

inline std::unique_ptr<Model> make_model(TestModel m) {
  if (m == TestModel::kGpt) return std::make_unique<Gpt>(small_gpt());
  return std::make_unique<Mlp>(small_mlp());
}

// `model` under `spec` (its own, or one marking other parameters: for
// optimizer kind MUON).
inline TrainRun train(Communicator& world, const proto::EngineConfig& config, Model& model, const ModelSpec& spec,
                      int steps) {
  Engine engine(spec, config, world);
  TrainRun run;
  for (int s = 0; s < steps; ++s) {
    const StepResult r = engine.step(model);
    run.losses.push_back(r.loss);
    run.norms.push_back(r.grad_norm);
  }
  run.weights = all_weights(engine);
  run.memory = engine.memory();
  run.plan = engine.plan();
  return run;
}

inline TrainRun train(Communicator& world, const proto::EngineConfig& config, Model& model, int steps) {
  return train(world, config, model, model.spec(), steps);
}

inline TrainRun train(Communicator& world, const proto::EngineConfig& config, const MlpConfig& mlp, int steps) {
  Mlp model(mlp);
  return train(world, config, model, steps);
}

inline TrainRun train(Communicator& world, const proto::EngineConfig& config, TestModel m, int steps) {
  const std::unique_ptr<Model> model = make_model(m);
  return train(world, config, *model, steps);
}

}  // namespace mp::testing

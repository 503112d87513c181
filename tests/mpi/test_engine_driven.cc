// The engine driven unit by unit from outside (Note [Driving the engine] in
// runtime/engine.h): a host's own passes give the bits of Engine::step, for
// every strategy, with accumulation and with a unit held through the
// forward; order mistakes are errors that name the unit, agreed over the
// ranks at finish_step.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/convert.h"
#include "tests/mpi/engine_test_util.h"
#include "tests/mpi/mpi_test.h"
#include "tests/test_util.h"

namespace mp::testing {
namespace {

using SC = proto::ShardingConfig;
using Pass = Engine::Pass;

class EngineDrivenTest : public EngineWorldTest {
 protected:
  EngineDrivenTest() : EngineWorldTest("driven") {}
};

// One step of `model` as a host drives it: the micro-batches Engine::step
// would run, each unit unsharded, run and resharded, the backward's
// gradients handed over unit by unit, the loss noted. With `hold_first`
// unit 0 stays unsharded from its forward to its backward (as a root unit
// around the whole forward).
// `as_host` (sharding.param_dtype_gradients): the model's fp32 gradients
// go into the engine's buffer converted to its dtype, as a host whose
// backward computes in the param dtype hands them over.
StepResult driven_step(Engine& engine, Model& model, int64_t step, bool hold_first, int r, Tensor* as_host = nullptr) {
  Stream& s = engine.compute();
  const int k = engine.options().micro_batches, U = engine.layout().num_units();
  const int W = engine.options().world_size;
  model.set_params_persist(false);
  for (int m = 0; m < k; ++m) {
    model.begin_micro_batch_on((step - 1) * W * k + static_cast<int64_t>(m) * W + r, s);
    Tensor first;
    for (int u = 0; u < U; ++u) {
      const Tensor params = engine.unshard(u, Pass::kForward);
      model.forward_on(u, params, s);
      if (u == 0 && hold_first) {
        first = params;
      } else {
        engine.reshard(u);
      }
    }
    double loss = 0;
    model.loss_on(&loss, s);
    for (int u = U - 1; u >= 0; --u) {
      const Tensor params = u == 0 && hold_first ? first : engine.unshard(u, Pass::kBackward);
      const Tensor grads = engine.gradient_buffer(u);
      if (as_host != nullptr && grads.dtype() != DType::kF32) {
        // The buffer's gaps and padding come zeroed; so must the copy's.
        const Tensor fp32 = as_host->flat(0, grads.numel());
        convert(grads, fp32, {}, &s);
        model.backward_on(u, params, fp32, s);
        convert(fp32, grads, {}, &s);
      } else {
        model.backward_on(u, params, grads, s);
      }
      engine.reshard(u);
      engine.reduce_gradients(u);
    }
    engine.wait_compute();
    engine.note_loss(loss);
  }
  return engine.finish_step();
}

TrainRun train_driven(Communicator& world, const proto::EngineConfig& config, Model& model, int steps,
                      bool hold_first) {
  Engine engine(model.spec(), config, world);
  Allocator host(Device::cpu());
  Tensor as_host = Tensor::zeros(host, DType::kF32, {engine.layout().max_padded_numel()}, MemCategory::kOther);
  TrainRun run;
  for (int s = 1; s <= steps; ++s) {
    const StepResult r = driven_step(engine, model, s, hold_first, world.rank(), &as_host);
    EXPECT_EQ(r.step, s);
    run.losses.push_back(r.loss);
    run.norms.push_back(r.grad_norm);
  }
  run.weights = all_weights(engine);
  run.memory = engine.memory();
  run.plan = engine.plan();
  return run;
}

constexpr int kSteps = MP_SANITIZE ? 2 : 4;

// The same bits as Engine::step: every strategy, two micro-batches, a
// recipe that gathers bf16 params and one that casts the master at the
// gather (one rank: into a staging buffer), with and without a unit held
// through the forward (sharding.held_units 1: one more buffer, planned).
TEST_F(EngineDrivenTest, AHostsOwnPassesGiveTheBitsOfStep) {
  const int n = size();
  for (TestModel m : {TestModel::kMlp, TestModel::kGpt}) {
    for (const std::string recipe : {"bf16_master", "amp_bf16"}) {
      for (Strategy strategy : all_strategies()) {
        for (int depth : {1, 2}) {
          SCOPED_TRACE(std::string(test_model_name(m)) + " " + recipe + " " + std::string(strategy_name(strategy)) +
                       " prefetch_depth " + std::to_string(depth));
          proto::EngineConfig c = engine_config(strategy, recipe, n, 2);
          c.mutable_sharding()->set_prefetch_depth(depth);
          c.mutable_optimizer()->set_grad_clip(0.5);
          const TrainRun ref = train(*world_, c, m, kSteps);
          for (bool hold : {false, true}) {
            c.mutable_sharding()->set_held_units(hold ? 1 : 0);
            const std::unique_ptr<Model> model = make_model(m);
            const TrainRun run = train_driven(*world_, c, *model, kSteps, hold);
            EXPECT_EQ(run.losses, ref.losses) << "hold " << hold;
            EXPECT_EQ(run.norms, ref.norms) << "hold " << hold;
            EXPECT_TRUE(same_bits(run.weights, ref.weights)) << "hold " << hold;
            for (int k = 0; k < kNumMemCategories; ++k) {
              const auto cat = static_cast<MemCategory>(k);
              if (cat == MemCategory::kActivations || cat == MemCategory::kOther) continue;
              EXPECT_EQ(run.memory.peak(cat), run.plan.at(cat)) << mem_category_name(cat) << " hold " << hold;
            }
          }
        }
      }
    }
  }
}

// sharding.param_dtype_gradients: where the wire dtype is the param dtype
// (bf16_master, pure_bf16: a reduce-scatter per micro-batch) the gradient
// buffers are bf16 and go on the wire as they are, with the bits of fp32
// buffers cast to bf16 on the way, and the plan counts them; elsewhere
// (several micro-batches unsharded, amp_fp16's loss scale) they stay fp32.
TEST_F(EngineDrivenTest, ParamDtypeGradientsGoOnTheWireWithTheSameBits) {
  const int n = size();
  for (const std::string recipe : {"bf16_master", "pure_bf16", "amp_fp16"}) {
    for (Strategy strategy : {SC::FULL_SHARD, SC::HYBRID_SHARD, SC::SHARD_GRAD_OP, SC::NO_SHARD}) {
      SCOPED_TRACE(recipe + " " + std::string(strategy_name(strategy)));
      proto::EngineConfig c = engine_config(strategy, recipe, n, 1);
      const TrainRun ref = train(*world_, c, TestModel::kGpt, kSteps);
      c.mutable_sharding()->set_param_dtype_gradients(true);
      const std::unique_ptr<Model> model = make_model(TestModel::kGpt);
      const TrainRun run = train_driven(*world_, c, *model, kSteps, false);
      EXPECT_EQ(run.losses, ref.losses);
      EXPECT_EQ(run.norms, ref.norms);
      EXPECT_TRUE(same_bits(run.weights, ref.weights));
      const EngineOptions o = resolve_engine_options(c, n);
      const bool as_is = recipe != "amp_fp16" && strategy != SC::NO_SHARD && !o.local_reduction();
      EXPECT_EQ(o.grad_buffer_dtype(), as_is ? DType::kBF16 : DType::kF32);
      if (as_is) {
        EXPECT_LT(run.plan.at(MemCategory::kGradient), ref.plan.at(MemCategory::kGradient));
      }
      for (int k = 0; k < kNumMemCategories; ++k) {
        const auto cat = static_cast<MemCategory>(k);
        if (cat == MemCategory::kActivations || cat == MemCategory::kOther) continue;
        EXPECT_EQ(run.memory.peak(cat), run.plan.at(cat)) << mem_category_name(cat);
      }
    }
  }
}

// Expects `f` to throw ConfigError whose message contains `what`.
void expect_config_error(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying: " << what;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

// Mistakes that one rank can see at the call.
TEST_F(EngineDrivenTest, OrderMistakesAreNamedAtTheCall) {
  const std::unique_ptr<Model> model = make_model(TestModel::kMlp);
  proto::EngineConfig c = engine_config(SC::FULL_SHARD, "bf16_master", size(), 1);
  c.mutable_sharding()->set_prefetch_depth(0);
  Engine engine(model->spec(), c, *world_);
  const std::string u0 = "unit 0 ('" + engine.layout().unit(0).name + "')";
  (void)engine.unshard(0, Pass::kForward);
  expect_config_error([&] { (void)engine.unshard(0, Pass::kForward); }, "unshard of " + u0 + ", which is unsharded");
  if (engine.options().gathers_per_unit()) {  // one buffer, held by unit 0
    expect_config_error([&] { (void)engine.unshard(1, Pass::kForward); }, "reshard one first");
  }
  engine.reshard(0);
  expect_config_error([&] { engine.reshard(0); }, "reshard of " + u0 + ", which is not unsharded");
  {
    // One rank, the master cast at the gather: one staging buffer, held.
    proto::EngineConfig cast = engine_config(SC::FULL_SHARD, "amp_bf16", 1, 1);
    Engine alone(model->spec(), cast, *self_);
    (void)alone.unshard(0, Pass::kForward);
    expect_config_error([&] { (void)alone.unshard(1, Pass::kForward); }, "raise sharding.held_units");
  }
  expect_config_error([&] { engine.reduce_gradients(0); },
                      "reduce_gradients of " + u0 + " without its gradient_buffer");
  expect_config_error([&] { (void)engine.unshard(7, Pass::kForward); }, "unshard: unit 7 does not exist");
  (void)engine.gradient_buffer(1);
  expect_config_error([&] { (void)engine.gradient_buffer(0); }, "are taken and not reduced");
  engine.reduce_gradients(1);
  expect_config_error([&] { (void)engine.gradient_buffer(1); }, "reduced 1 times this step, engine.micro_batches is 1");
}

// Mistakes seen at finish_step are agreed first: every rank throws, the
// others naming the rank that made it, and none waits for a reduction its
// peers never issued.
TEST_F(EngineDrivenTest, FinishingOutOfOrderIsNamedOnEveryRank) {
  const std::unique_ptr<Model> model = make_model(TestModel::kMlp);
  const proto::EngineConfig c = engine_config(SC::FULL_SHARD, "fp32", size(), 1);
  {
    Engine engine(model->spec(), c, *world_);
    expect_config_error([&] { (void)engine.finish_step(); }, "finish_step without a backward");
  }
  {
    // Every rank forgets unit 0 in the backward.
    Engine engine(model->spec(), c, *world_);
    Stream& s = engine.compute();
    model->set_params_persist(false);
    model->begin_micro_batch_on(0, s);
    const int U = engine.layout().num_units();
    for (int u = 0; u < U; ++u) {
      model->forward_on(u, engine.unshard(u, Pass::kForward), s);
      engine.reshard(u);
    }
    for (int u = U - 1; u >= 1; --u) {
      const Tensor params = engine.unshard(u, Pass::kBackward);
      model->backward_on(u, params, engine.gradient_buffer(u), s);
      engine.reshard(u);
      engine.reduce_gradients(u);
    }
    expect_config_error([&] { (void)engine.finish_step(); }, "were reduced 0 times, engine.micro_batches is 1");
  }
  if (size() < 2) return;
  {
    // The last rank leaves a unit unsharded (NO_SHARD: unsharding issues no
    // collective, so only finish_step can tell): the others learn it.
    const proto::EngineConfig nc = engine_config(SC::NO_SHARD, "fp32", size(), 1);
    Engine engine(model->spec(), nc, *world_);
    const bool late = rank() == size() - 1;
    (void)driven_step(engine, *model, 1, false, rank());
    model->begin_micro_batch_on(rank(), engine.compute());
    const int U = engine.layout().num_units();
    for (int u = 0; u < U; ++u) {
      model->forward_on(u, engine.unshard(u, Pass::kForward), engine.compute());
      engine.reshard(u);
    }
    for (int u = U - 1; u >= 0; --u) {
      const Tensor params = engine.unshard(u, Pass::kBackward);
      model->backward_on(u, params, engine.gradient_buffer(u), engine.compute());
      if (u > 0 || !late) engine.reshard(u);
      engine.reduce_gradients(u);
    }
    try {
      (void)engine.finish_step();
      ADD_FAILURE() << "finish_step did not throw";
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("is unsharded: reshard it after its backward"), std::string::npos) << msg;
      if (!late) {
        EXPECT_NE(msg.find("failed on rank " + std::to_string(size() - 1)), std::string::npos) << msg;
      }
    }
  }
}

}  // namespace
}  // namespace mp::testing

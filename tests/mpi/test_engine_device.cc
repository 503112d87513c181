// The engine with a model written only in device-dispatched ops
// (tests/quadratic_model.h) on the CPU: what the GPU tests
// (tests/gpu/test_gpu_engine.cc) compare a GPU step against.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/mpi/engine_test_util.h"
#include "tests/quadratic_model.h"

namespace mp::testing {
namespace {

class EngineDeviceTest : public EngineWorldTest {
 protected:
  EngineDeviceTest() : EngineWorldTest("engine device") {}
};

// Loss and one SGD step against float64: the model is 0.5 |w - t|^2, so
// the loss is known from the initial weights and w1 = w0 - lr (w0 - t).
TEST_F(EngineDeviceTest, QuadraticModelTrainsAsPlainSgdSays) {
  const std::vector<int64_t> sizes = {1000, 37, 4099};
  QuadraticModel model(sizes, Device::cpu());
  proto::EngineConfig config = engine_config(proto::ShardingConfig::FULL_SHARD, "fp32", world_->size(), 2);
  config.mutable_optimizer()->set_kind(proto::OptimizerConfig::SGD);
  config.mutable_optimizer()->set_weight_decay(0);
  config.mutable_optimizer()->set_lr(0.1);
  Engine engine(model.spec(), config, *world_);
  const std::vector<std::vector<float>> w0 = all_weights(engine);
  double loss = 0;
  for (size_t u = 0; u < sizes.size(); ++u) {
    for (int64_t i = 0; i < sizes[u]; ++i) {
      const double d = static_cast<double>(w0[u][static_cast<size_t>(i)]) - std::sin(1.0 + static_cast<double>(u) + 0.37 * static_cast<double>(i));
      loss += 0.5 * d * d;
    }
  }
  const StepResult r = engine.step(model);
  EXPECT_NEAR(r.loss, loss, 1e-6 * loss);  // d = w - t is rounded to fp32 per element
  const std::vector<std::vector<float>> w1 = all_weights(engine);
  for (size_t u = 0; u < sizes.size(); ++u) {
    for (int64_t i = 0; i < sizes[u]; i += 7) {
      const double w = w0[u][static_cast<size_t>(i)];
      const double t = std::sin(1.0 + static_cast<double>(u) + 0.37 * static_cast<double>(i));
      ASSERT_NEAR(w1[u][static_cast<size_t>(i)], w - 0.1 * (w - t), 1e-6) << "unit " << u << " element " << i;
    }
  }
  EXPECT_GT(r.timings.compute_s, 0.0);
  EXPECT_GE(r.timings.exposed_comm_s, 0.0);
  EXPECT_GT(r.timings.update_s, 0.0);
}

TEST_F(EngineDeviceTest, MemoryAndCommunicatorOnDifferentDevicesIsAConfigError) {
  QuadraticModel model({16}, Device::cpu());
  const std::string e = error_of<ConfigError>([&] {
    Engine engine(model.spec(), engine_config(proto::ShardingConfig::FULL_SHARD, "fp32", world_->size(), 1), *world_,
                  Allocator(Device::cuda(0)));
  });
  EXPECT_NE(e.find("the engine's memory is on cuda:0 but its communicator 'engine device' moves tensors on cpu"),
            std::string::npos)
      << e;
}

// A stream on a device, for what must refuse it (no GPU needed).
class DeviceStream final : public Stream {
 public:
  DeviceStream() : Stream("device stream") {}
  Device device() const override { return Device::cuda(0); }
  Event record() override { return Event(); }
  void wait(const Event&) override {}
  void host_task(std::function<void()>, TaskName) override { ADD_FAILURE() << "a host model enqueued on a device stream"; }
  void rethrow_failure() override {}
};

// A host model: bodies that do nothing.
class EmptyHostModel final : public HostModel {
 public:
  const ModelSpec& spec() const override { return spec_; }
  void begin_micro_batch(int64_t) override {}
  void forward(int, const Tensor&) override {}
  double loss() const override { return 0.0; }
  void backward(int, const Tensor&, const Tensor&) override {}

 private:
  ModelSpec spec_;
};

TEST_F(EngineDeviceTest, AHostModelRefusesADeviceStream) {
  EmptyHostModel model;
  DeviceStream s;
  const std::string e = error_of<ConfigError>([&] { model.begin_micro_batch_on(0, s); });
  EXPECT_NE(e.find("this model computes on the host, but the engine runs on cuda:0"), std::string::npos) << e;
}

// The built-in models compute on their allocator's device, and say so when
// handed another device's stream.
TEST_F(EngineDeviceTest, ABuiltInModelRefusesAStreamOfAnotherDevice) {
  DeviceStream s;
  Mlp mlp(small_mlp());
  std::string e = error_of<ConfigError>([&] { mlp.begin_micro_batch_on(0, s); });
  EXPECT_NE(e.find("the MLP computes on cpu (its allocator's device), but stream 'device stream' runs on cuda:0"),
            std::string::npos)
      << e;
  Gpt gpt(small_gpt());
  e = error_of<ConfigError>([&] { gpt.begin_micro_batch_on(0, s); });
  EXPECT_NE(e.find("the GPT computes on cpu (its allocator's device), but stream 'device stream' runs on cuda:0"),
            std::string::npos)
      << e;
}

// A device fault surfaces at the rank's next device call, far from its
// cause: Engine::step adds where the rank was. Stood in for on the CPU by a
// model whose backward of the last unit fails with a CudaError in step 2.
class FaultyModel final : public Model {
 public:
  explicit FaultyModel(QuadraticModel& inner) : inner_(inner) {}
  const ModelSpec& spec() const override { return inner_.spec(); }
  void begin_micro_batch_on(int64_t g, Stream& s) override { inner_.begin_micro_batch_on(g, s); }
  void forward_on(int u, const Tensor& params, Stream& s) override { inner_.forward_on(u, params, s); }
  void loss_on(double* loss, Stream& s) override { inner_.loss_on(loss, s); }
  void backward_on(int u, const Tensor& params, const Tensor& grads, Stream& s) override {
    if (++backwards_ > static_cast<int>(spec().units.size())) {
      auto* cpu = dynamic_cast<CpuStream*>(&s);
      ASSERT_NE(cpu, nullptr);
      cpu->submit([] { MP_THROW(CudaError, "cudaErrorIllegalAddress: an illegal memory access was encountered"); });
      return;
    }
    inner_.backward_on(u, params, grads, s);
  }

 private:
  QuadraticModel& inner_;
  int backwards_ = 0;
};

TEST_F(EngineDeviceTest, ADeviceErrorInAStepSaysTheRankDeviceStepAndLastCollective) {
  QuadraticModel inner({1000, 37}, Device::cpu());
  FaultyModel model(inner);
  Engine engine(model.spec(), engine_config(proto::ShardingConfig::FULL_SHARD, "fp32", world_->size(), 1), *world_);
  engine.step(model);
  const std::string e = error_of<CudaError>([&] { engine.step(model); });
  EXPECT_NE(e.find("cudaErrorIllegalAddress"), std::string::npos) << e;
  EXPECT_NE(e.find(detail::str("[rank ", world_->rank(), " on cpu, step 2; last collective issued: ")),
            std::string::npos)
      << e;
  // One rank moves nothing through its communicator.
  EXPECT_NE(e.find(world_->size() == 1 ? "last collective issued: none]" : "(data-plane collective "), std::string::npos)
      << e;
}

}  // namespace
}  // namespace mp::testing

// GPU tests of the engine (CTest label "gpu"; every test skips without a
// device): the model of tests/quadratic_model.h, written only in the
// engine's device-dispatched ops, trained by a CUDA engine and by a CPU
// engine in the same process, with the fp32 recipe in deterministic mode.
// The fused update's element math is shared (kernels/update_math.h, no FMA
// contraction on either side), so the weights must agree bitwise; the loss
// and norm come from sums whose order differs (CPU: four fp64 partial sums;
// CUDA: per-block partials), so they agree to 1e-12 relative.
// - gpu_engine_np1: the data plane is NCCL on one GPU, then the staged MPI
//   backend on the same GPU.
// - The MLP (models/mlp.h), five fp32 steps, against the same on the CPU.
// - The GPT (models/gpt.h) trained by the CUDA engine against
//   the host GPT trained by the CPU engine, fp32 and bf16_master: the same
//   model and data, so the losses agree to fp32 rounding (fp32) or to the
//   bf16 band (bf16_master) over several steps.
// - The GPT with every block's activations recomputed: the same bits.
// - The GPT under optimizer kind MUON against the same on the CPU.
// - gpu_engine_np2: two ranks share the GPU (the staged MPI backend, as on
//   any one-GPU machine); NCCL runs only where every rank has its own GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/staged_communicator.h"
#include "core/device.h"
#include "models/gpt.h"
#include "mp/config.h"
#include "runtime/engine.h"
#include "runtime/precision.h"
#include "tests/gpu/gpu_comm.h"
#include "tests/mpi/engine_test_util.h"
#include "tests/quadratic_model.h"
#if MP_WITH_NCCL
#include "comm/nccl/nccl_communicator.h"
#endif

namespace mp::testing {
namespace {

const std::vector<int64_t> kSizes = {1000, 37, 4099, 65536};

struct DeviceRun {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> weights;
};

class GpuEngine : public MpiTest {
 protected:
  void SetUp() override {
    MpiTest::SetUp();
    const CudaInfo info = cuda_info();
    if (info.device_count == 0) GTEST_SKIP() << "no CUDA device: " << info.unavailable_reason;
    gpus_ = info.device_count;
    device_ = Device::cuda(rank() % gpus_);
    set_current_device(device_);
  }

  static proto::EngineConfig config(int world) {
    proto::EngineConfig c = engine_config(proto::ShardingConfig::FULL_SHARD, "fp32", world, 2);
    c.set_deterministic(true);
    return c;
  }

  // Three steps of the quadratic model on `world`'s device.
  static DeviceRun train(Communicator& world, Device device) {
    QuadraticModel model(kSizes, device);
    Engine engine(model.spec(), config(world.size()), world, Allocator(device));
    DeviceRun run;
    for (int s = 0; s < 3; ++s) {
      const StepResult r = engine.step(model);
      run.losses.push_back(r.loss);
      run.norms.push_back(r.grad_norm);
    }
    run.weights = all_weights(engine);
    return run;
  }

  static void expect_same(const DeviceRun& gpu, const DeviceRun& cpu) {
    ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
    for (size_t s = 0; s < cpu.losses.size(); ++s) {
      EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-12 * std::abs(cpu.losses[s])) << "step " << s + 1;
      EXPECT_NEAR(gpu.norms[s], cpu.norms[s], 1e-12 * std::abs(cpu.norms[s])) << "step " << s + 1;
    }
    ASSERT_EQ(gpu.weights.size(), cpu.weights.size());
    for (size_t u = 0; u < cpu.weights.size(); ++u) {
      ASSERT_EQ(gpu.weights[u].size(), cpu.weights[u].size());
      for (size_t i = 0; i < cpu.weights[u].size(); ++i) {
        ASSERT_EQ(std::memcmp(&gpu.weights[u][i], &cpu.weights[u][i], 4), 0)
            << "unit " << u << " element " << i << ": " << gpu.weights[u][i] << " on the GPU, " << cpu.weights[u][i]
            << " on the CPU";
      }
    }
  }

  DeviceRun cpu_run() {
    auto world = MpiCommunicator::create_world("cpu engine", testing::gpu_test_comm_options());
    return train(*world, Device::cpu());
  }

  int gpus_ = 0;
  Device device_;
};

TEST_F(GpuEngine, StagedMpiStepsEqualTheCpuSteps) {
  const DeviceRun cpu = cpu_run();
  auto staged = StagedMpiCommunicator::create(
      MpiCommunicator::create_world("staged engine", testing::gpu_test_comm_options()), device_);
  expect_same(train(*staged, device_), cpu);
}

TEST_F(GpuEngine, NcclStepsEqualTheCpuSteps) {
#if MP_WITH_NCCL
  if (size() > gpus_) GTEST_SKIP() << "more ranks (" << size() << ") than GPUs (" << gpus_ << "): NCCL needs one GPU per rank";
  const DeviceRun cpu = cpu_run();
  auto nccl = NcclCommunicator::create(testing::make_world("nccl engine (host)"), device_, "nccl engine", {});
  expect_same(train(*nccl, device_), cpu);
#else
  GTEST_SKIP() << "built without NCCL";
#endif
}

// Five steps of a small GPT: the losses, on `world`'s device, with the
// blocks' activations recomputed every `recompute_every`-th block (0: none),
// the config then changed by `adjust`.
std::vector<double> gpt_losses(Communicator& world, Device device, const std::string& recipe,
                               int recompute_every = 0,
                               const std::function<void(proto::EngineConfig&)>& adjust = nullptr) {
  GptConfig g;
  g.vocab = 70;
  g.context = 40;
  g.channels = 64;
  g.heads = 2;
  g.layers = 2;
  g.micro_batch_size = 3;
  g.threads = 1;
  proto::EngineConfig c = engine_config(proto::ShardingConfig::FULL_SHARD, recipe, world.size(), 2);
  // Deterministic mode needs an fp32 reduce dtype: bf16_master reduces in bf16.
  c.set_deterministic(recipe == "fp32");
  const Precision precision = resolve_precision(c.precision(), true);
  g.matmul_dtype = gpt_matmul_dtype(std::nullopt, precision.param_dtype);
  GptOptions o;
  o.recompute_every = recompute_every;
  if (recompute_every > 0) {
    c.mutable_activation_checkpointing()->set_policy(proto::ActivationCheckpointing::EVERY_UNIT);
  }
  if (adjust) adjust(c);
  Allocator alloc(device);
  auto model = std::make_unique<Gpt>(g, alloc, nullptr, o);  // on the allocator's device
  Engine engine(model->spec(), c, world, alloc);
  std::vector<double> losses;
  for (int s = 0; s < 5; ++s) losses.push_back(engine.step(*model).loss);
  EXPECT_EQ(static_cast<int64_t>(alloc.stats().current(MemCategory::kActivations)),
            Gpt::activation_bytes(g, device, o));
  const MemoryPlan plan = engine.plan();  // as planned for this device
  for (int k = 0; k < kNumMemCategories; ++k) {
    const auto cat = static_cast<MemCategory>(k);
    if (cat == MemCategory::kActivations || cat == MemCategory::kOther) continue;
    EXPECT_EQ(alloc.stats().current(cat), plan.at(cat)) << mem_category_name(cat) << " on " << to_string(device);
  }
  return losses;
}

TEST_F(GpuEngine, GptTrainsAsOnTheCpu) {
  for (const char* recipe : {"fp32", "bf16_master"}) {
    SCOPED_TRACE(recipe);
    auto cpu_world = MpiCommunicator::create_world("cpu gpt", testing::gpu_test_comm_options());
    const std::vector<double> cpu = gpt_losses(*cpu_world, Device::cpu(), recipe);
    auto staged = StagedMpiCommunicator::create(
        MpiCommunicator::create_world("staged gpt", testing::gpu_test_comm_options()), device_);
    const std::vector<double> gpu = gpt_losses(*staged, device_, recipe);
    const double tol = std::string(recipe) == "fp32" ? 1e-4 : 2e-2;
    for (size_t s = 0; s < cpu.size(); ++s) {
      EXPECT_NEAR(gpu[s], cpu[s], tol * cpu[s]) << "step " << s + 1;
    }
    EXPECT_LT(gpu.back(), gpu.front()) << "the GPU run does not learn";
  }
}

// Optimizer kind MUON on the GPU (Note [Muon in the engine]): the momentum
// and the update as kernels, Newton-Schulz through cuBLASLt, fp32
// iterations; after the backward and overlapped with it (Note [Muon
// overlapped]). The losses follow the CPU engine's to fp32 rounding.
TEST_F(GpuEngine, GptWithMuonTrainsAsOnTheCpu) {
  for (const bool in_backward : {false, true}) {
    SCOPED_TRACE(in_backward ? "optimizer_in_backward" : "after the backward");
    auto muon = [&](proto::EngineConfig& c) {
      c.mutable_optimizer()->set_kind(proto::OptimizerConfig::MUON);
      c.mutable_optimizer()->set_lr(2e-2);
      c.mutable_optimizer()->mutable_muon()->set_iteration_dtype(proto::FP32);
      c.mutable_sharding()->set_optimizer_in_backward(in_backward);
    };
    auto cpu_world = MpiCommunicator::create_world("cpu muon", testing::gpu_test_comm_options());
    const std::vector<double> cpu = gpt_losses(*cpu_world, Device::cpu(), "fp32", 0, muon);
    auto staged = StagedMpiCommunicator::create(
        MpiCommunicator::create_world("staged muon", testing::gpu_test_comm_options()), device_);
    const std::vector<double> gpu = gpt_losses(*staged, device_, "fp32", 0, muon);
    for (size_t s = 0; s < cpu.size(); ++s) EXPECT_NEAR(gpu[s], cpu[s], 1e-4 * cpu[s]) << "step " << s + 1;
    EXPECT_LT(gpu.back(), gpu.front()) << "the GPU run does not learn";
  }
}

// Note [GPT recomputation] on the GPU: recomputing every block gives the
// losses of keeping their activations bit for bit (the CUDA kernels are
// deterministic too), with fewer activation bytes, as planned.
TEST_F(GpuEngine, GptRecomputationChangesNoBit) {
  for (const char* recipe : {"fp32", "bf16_master"}) {
    SCOPED_TRACE(recipe);
    auto staged = StagedMpiCommunicator::create(
        MpiCommunicator::create_world("staged recompute", testing::gpu_test_comm_options()), device_);
    const std::vector<double> kept = gpt_losses(*staged, device_, recipe);
    const std::vector<double> recomputed = gpt_losses(*staged, device_, recipe, 1);
    EXPECT_EQ(recomputed, kept);
  }
}

// Five steps of the MLP (fp32): the losses, on `world`'s device.
std::vector<double> mlp_losses(Communicator& world, Device device) {
  proto::EngineConfig c = engine_config(proto::ShardingConfig::FULL_SHARD, "fp32", world.size(), 2);
  c.set_deterministic(true);
  Allocator alloc(device);
  Mlp model(small_mlp(), alloc);  // on the allocator's device
  Engine engine(model.spec(), c, world, alloc);
  std::vector<double> losses;
  for (int s = 0; s < 5; ++s) losses.push_back(engine.step(model).loss);
  return losses;
}

TEST_F(GpuEngine, MlpTrainsAsOnTheCpu) {
  auto cpu_world = MpiCommunicator::create_world("cpu mlp", testing::gpu_test_comm_options());
  const std::vector<double> cpu = mlp_losses(*cpu_world, Device::cpu());
  auto staged = StagedMpiCommunicator::create(
      MpiCommunicator::create_world("staged mlp", testing::gpu_test_comm_options()), device_);
  const std::vector<double> gpu = mlp_losses(*staged, device_);
  for (size_t s = 0; s < cpu.size(); ++s) EXPECT_NEAR(gpu[s], cpu[s], 1e-4 * cpu[s]) << "step " << s + 1;
  EXPECT_LT(gpu.back(), gpu.front()) << "the GPU run does not learn";
}

}  // namespace
}  // namespace mp::testing

// The engine and a model whose host thread runs ahead of its compute
// stream (Note [Host runs ahead] in models/model.h), on every rank:
// - each micro-batch's loss lands in its own slot: the step's loss is the
//   mean of the micro-batches' losses computed one by one (also under
//   MP_ORDER_TORTURE=1, label "torture");
// - under torture, a model that checks host state in a stream task (what
//   the CUDA GPT's loss() once did) fails: the torture run can catch that
//   bug, and it fails as an error of the step, not an abort;
// - a stream task that throws fails the step with its op, unit, rank,
//   device and step, and the next engine call says the same;
// - a model that fails on one rank fails the step on every rank at once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/stream.h"
#include "tests/mpi/engine_test_util.h"

namespace mp::testing {
namespace {

class EngineStreamsTest : public EngineWorldTest {
 protected:
  EngineStreamsTest() : EngineWorldTest("engine streams") {}
};

Tensor wrap_vector(std::vector<float>& v) {
  return Tensor::wrap(v.data(), Device::cpu(), DType::kF32, {static_cast<int64_t>(v.size())});
}

TEST_F(EngineStreamsTest, EachMicroBatchsLossLandsInItsOwnSlot) {
  const int W = size(), k = 4;
  const GptConfig g = small_gpt();
  Gpt model(g);
  Engine engine(model.spec(), engine_config(proto::ShardingConfig::FULL_SHARD, "fp32", W, k), *world_);
  for (int step = 1; step <= 2; ++step) {
    std::vector<std::vector<float>> weights = all_weights(engine);  // what this step computes with
    const double loss = engine.step(model).loss;
    // The same micro-batches one at a time, summed in the engine's order.
    Gpt direct(g);
    std::vector<Tensor> params, grads;
    std::vector<std::vector<float>> grad_space = weights;
    for (size_t u = 0; u < weights.size(); ++u) {
      params.push_back(wrap_vector(weights[u]));
      grads.push_back(wrap_vector(grad_space[u]));
    }
    double sum = 0;
    for (int m = 0; m < k; ++m) {
      for (int r = 0; r < W; ++r) sum += run_model(direct, (step - 1) * W * k + m * W + r, params, grads);
    }
    EXPECT_EQ(loss, sum / (W * k)) << "step " << step;
  }
}

// The GPT, except that its loss task also checks that every unit of its
// micro-batch was forwarded, reading what the host thread keeps of that
// (the micro-batch it loaded last, the units it forwarded since): a bug,
// since the host has moved on to later micro-batches by the time the task
// runs. The CUDA GPT's loss() once did this.
class HostStateInAStreamTask final : public Model {
 public:
  explicit HostStateInAStreamTask(const GptConfig& c) : inner_(c) {}
  const ModelSpec& spec() const override { return inner_.spec(); }
  void begin_micro_batch_on(int64_t g, Stream& s) override {
    inner_.begin_micro_batch_on(g, s);
    loaded_ = g;
    forwarded_ = 0;
  }
  void forward_on(int u, const Tensor& params, Stream& s) override {
    inner_.forward_on(u, params, s);
    ++forwarded_;
  }
  void loss_on(double* loss, Stream& s) override {
    inner_.loss_on(loss, s);
    const int units = static_cast<int>(spec().units.size());
    const int64_t mine = loaded_;
    s.host_task(
        [this, units, mine] {
          MP_ENFORCE(loaded_ == mine && forwarded_ == units, "the loss of micro-batch ", mine,
                     " ran while the host was at micro-batch ", loaded_, ", unit ", forwarded_);
        },
        TaskName{"check of the host's forward count"});
  }
  void backward_on(int u, const Tensor& params, const Tensor& grads, Stream& s) override {
    inner_.backward_on(u, params, grads, s);
  }

 private:
  Gpt inner_;
  // Host state, read by the stream task: the planted bug (the race itself
  // is what the test provokes).
  std::atomic<int64_t> loaded_{-1};
  std::atomic<int> forwarded_{0};
};

TEST_F(EngineStreamsTest, TortureCatchesAStreamTaskThatReadsHostState) {
  if (!order_torture()) GTEST_SKIP() << "needs MP_ORDER_TORTURE=1 (ctest engine_np2_order_torture)";
  HostStateInAStreamTask model(small_gpt());
  Engine engine(model.spec(), engine_config(proto::ShardingConfig::FULL_SHARD, "fp32", size(), 4), *world_);
  std::string error;
  for (int step = 0; step < 3 && error.empty(); ++step) {
    try {
      engine.step(model);
    } catch (const EnforceError& e) {
      error = e.what();
    }
  }
  ASSERT_FALSE(error.empty()) << "the compute stream lagged, yet the host's count was always right";
  EXPECT_NE(error.find("ran while the host was at micro-batch"), std::string::npos) << error;
  EXPECT_NE(error.find("[op 'check of the host's forward count' on stream 'compute']"), std::string::npos) << error;
}

// Tokens of the small GPT's data, except one outside the vocabulary from
// micro-batch `bad` on.
class BadTokenFrom final : public TokenBatchSource {
 public:
  BadTokenFrom(const GptConfig& c, int64_t bad) : data_(c), bad_(bad), vocab_(c.vocab) {}
  int64_t batch() const override { return data_.batch(); }
  int64_t context() const override { return data_.context(); }
  void micro_batch(int64_t g, int32_t* inputs, int32_t* targets) const override {
    data_.micro_batch(g, inputs, targets);
    if (g >= bad_) inputs[3] = static_cast<int32_t>(vocab_ + 5);
  }
  std::string describe() const override { return "bad tokens"; }

 private:
  GptData data_;
  int64_t bad_;
  int64_t vocab_;
};

TEST_F(EngineStreamsTest, AFailedStreamTaskFailsTheStepWithItsOpRankDeviceAndStep) {
  const GptConfig g = small_gpt();
  const int W = size();
  Gpt model(g, Allocator(), std::make_shared<BadTokenFrom>(g, 2 * W));  // step 2's micro-batches, every rank
  Engine engine(model.spec(), engine_config(proto::ShardingConfig::FULL_SHARD, "fp32", W, 2), *world_);
  engine.step(model);  // micro-batches 0 .. 2W - 1: fine
  const std::string e = error_of<EnforceError>([&] { engine.step(model); });
  EXPECT_NE(e.find("token " + std::to_string(g.vocab + 5) + " at row 3 outside [0, " + std::to_string(g.vocab) + ")"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("[op 'embedding forward' of unit 'embed' on stream 'compute']"), std::string::npos) << e;
  const std::string where = "[rank " + std::to_string(rank()) + " on cpu, step 2; last collective issued: ";
  EXPECT_NE(e.find(where), std::string::npos) << e;
  // The stream stays failed: the next call says the same, and nothing hangs.
  const std::string again = error_of<EnforceError>([&] { engine.evaluate(model, 0, 1); });
  EXPECT_NE(again.find("[op 'embedding forward' of unit 'embed' on stream 'compute']"), std::string::npos) << again;
  EXPECT_NE(again.find(where), std::string::npos) << again;
}

// The MLP as a host's model whose call `fail_call` of `fail_unit` throws
// ModelError on rank `fail_rank` in micro-batch `fail_micro_batch` (as a
// Python callback that raises does).
class FailingHostMlp final : public HostModel {
 public:
  FailingHostMlp(int fail_rank, int64_t fail_micro_batch, std::string fail_call, int fail_unit, int rank)
      : inner_(small_mlp()), fail_(rank == fail_rank), micro_batch_(fail_micro_batch), call_(std::move(fail_call)),
        unit_(fail_unit) {}
  const ModelSpec& spec() const override { return inner_.spec(); }
  void begin_micro_batch(int64_t g) override {
    current_ = g;
    inner_.begin_micro_batch(g);
  }
  void forward(int unit, const Tensor& params) override {
    maybe_fail("forward", unit);
    inner_.forward(unit, params);
  }
  double loss() const override { return inner_.loss(); }
  void backward(int unit, const Tensor& params, const Tensor& grads) override {
    maybe_fail("backward", unit);
    inner_.backward(unit, params, grads);
  }

 private:
  void maybe_fail(const char* call, int unit) const {
    if (fail_ && current_ == micro_batch_ && call_ == call && unit == unit_) {
      MP_THROW(ModelError, "the host's ", call, " of unit ", unit, " raised: ValueError: boom");
    }
  }
  Mlp inner_;
  bool fail_;
  int64_t micro_batch_;
  std::string call_;
  int unit_;
  int64_t current_ = -1;
};

// Note [A failed step] in runtime/engine.h: a model that fails on one rank
// fails the step on every rank at once, as ModelError, the others naming the
// failed rank and its message; no rank waits for a collective's timeout
// (300 s here), under every strategy, in forward and in backward.
TEST_F(EngineStreamsTest, AModelFailingOnOneRankFailsTheStepOnEveryRankAtOnce) {
  const int W = size(), last = W - 1;
  for (Strategy strategy : all_strategies()) {
    for (const char* call : {"forward", "backward"}) {
      SCOPED_TRACE(std::string(strategy_name(strategy)) + " " + call);
      proto::EngineConfig c = engine_config(strategy, "bf16_master", W, 2);
      FailingHostMlp model(last, /*fail_micro_batch=*/2 * W + W + last, call, /*fail_unit=*/1, rank());  // step 2
      Engine engine(model.spec(), c, *world_);
      engine.step(model);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        engine.step(model);
        ADD_FAILURE() << "the step did not fail on rank " << rank();
      } catch (const ModelError& e) {
        const std::string what = e.what();
        EXPECT_TRUE(e.agreed()) << what;
        EXPECT_TRUE(contains(what, std::string("the host's ") + call + " of unit 1 raised: ValueError: boom")) << what;
        if (rank() != last) {
          EXPECT_TRUE(contains(what, "step 2 failed on rank " + std::to_string(last))) << what;
        }
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_LT(seconds, 30.0) << "the ranks waited for a timeout";
    }
  }
}

}  // namespace
}  // namespace mp::testing

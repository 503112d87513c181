// Comm hooks (fp32, bf16/fp16 compression, user hooks) and the 2-D mesh.
#include <random>

#include "comm/hooks.h"
#include "comm/mesh.h"
#include "comm/mpi/mpi_communicator.h"
#include "tests/mpi/comm_test_util.h"
#include "tests/mpi/mpi_test.h"

namespace mp {
namespace {

using testing::rounded;

double gradient(int rank, int64_t i, double scale) {
  std::mt19937_64 g(static_cast<uint64_t>(i) * 31337u + static_cast<uint64_t>(rank) + 1);
  return std::normal_distribution<double>(0.0, scale)(g);
}

class Hooks : public testing::CommTest {
 protected:
  Hooks() : CommTest("dp") {}
  GradBucket bucket(int index, int64_t n, double scale) {
    GradBucket b{index, Tensor::empty(alloc_, DType::kF32, {n}, MemCategory::kGradient)};
    float* g = b.grads.data_as<float>();
    for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(gradient(rank(), i, scale));
    return b;
  }
  // Max over elements of |result - exact mean| / (mean of |inputs|).
  double worst_relative_error(const GradBucket& b, double scale) {
    double worst = 0;
    const float* g = b.grads.data_as<float>();
    for (int64_t i = 0; i < b.grads.numel(); ++i) {
      double mean = 0, mean_abs = 0;
      for (int r = 0; r < size(); ++r) {
        const double x = static_cast<float>(gradient(r, i, scale));
        mean += x / size();
        mean_abs += std::fabs(x) / size();
      }
      worst = std::max(worst, std::fabs(g[i] - mean) / mean_abs);
    }
    return worst;
  }
  CommHookRegistry registry_;
  Allocator alloc_;
};

TEST_F(Hooks, Fp32HookAverages) {
  auto hook = registry_.make("fp32", alloc_);
  GradBucket b = bucket(0, 10007, 1.0);
  hook->run(*comm_, b)->wait();
  EXPECT_LT(worst_relative_error(b, 1.0), size() * 0x1p-23) << "fp32 rounding only";
}

TEST_F(Hooks, Bf16CompressionErrorIsWithinItsBound) {
  auto hook = registry_.make("bf16_compress", alloc_);
  for (int run = 0; run < 2; ++run) {  // the second run reuses the wire buffer
    GradBucket b = bucket(3, 10007, 1.0);
    hook->run(*comm_, b)->wait();
    // bf16's unit roundoff is u = 2^-8. The N inputs are rounded once each
    // (together at most u * mean|x|) and each of the N - 1 partial sums once
    // (each at most u * mean|x|): N * u * mean|x| in all.
    const double err = worst_relative_error(b, 1.0);
    EXPECT_LE(err, size() * 0x1p-8) << "run " << run;
    for (int64_t i = 0; i < b.grads.numel(); ++i) {
      const float v = b.grads.data_as<float>()[i];
      ASSERT_EQ(rounded(DType::kBF16, v), v) << "result " << i << " is not a bf16 value: no compression?";
    }
    if (size() > 1) {
      EXPECT_GT(err, 0.0) << "compression must lose something";
    }
  }
  EXPECT_EQ(alloc_.stats().current(MemCategory::kCommScratch), 10007u * 2) << "one bf16 buffer, reused";
}

TEST_F(Hooks, Fp16CompressionPredividesAgainstOverflow) {
  EXPECT_EQ(fp16_predivide_factor(1), 1);
  EXPECT_EQ(fp16_predivide_factor(2), 2);
  EXPECT_EQ(fp16_predivide_factor(4), 2);
  EXPECT_EQ(fp16_predivide_factor(8), 4);
  EXPECT_EQ(fp16_predivide_factor(16), 4);
  EXPECT_EQ(fp16_predivide_factor(64), 8);
  auto hook = registry_.make("fp16_compress", alloc_);
  // Gradients near 20000: a plain fp16 sum over 4 ranks (80000) overflows.
  GradBucket b = bucket(0, 4099, 1.0);
  for (int64_t i = 0; i < b.grads.numel(); ++i) b.grads.data_as<float>()[i] += 20000.0f;
  hook->run(*comm_, b)->wait();
  for (int64_t i = 0; i < b.grads.numel(); ++i) {
    const float v = b.grads.data_as<float>()[i];
    ASSERT_TRUE(std::isfinite(v)) << "element " << i;
    double mean = 0;
    for (int r = 0; r < size(); ++r) mean += (static_cast<float>(gradient(r, i, 1.0)) + 20000.0) / size();
    // fp16's unit roundoff is 2^-11: the same N * u * mean|x| bound.
    ASSERT_LE(std::fabs(v - mean), size() * 20000.0 * 0x1p-11) << "element " << i;
  }
}

TEST_F(Hooks, UserHookGetsTheBucket) {
  struct Seen {
    int index = -1;
    int64_t numel = 0;
    const void* data = nullptr;
  };
  auto seen = std::make_shared<Seen>();
  class Recording final : public CommHook {
   public:
    explicit Recording(std::shared_ptr<Seen> s) : seen_(std::move(s)) {}
    WorkPtr run(Communicator& comm, const GradBucket& b) override {
      *seen_ = Seen{b.index, b.grads.numel(), b.grads.data()};
      return comm.all_reduce(b.grads, b.grads, {ReduceOp::kAvg});
    }
   private:
    std::shared_ptr<Seen> seen_;
  };
  registry_.add("recording", [seen](Allocator&) { return std::make_unique<Recording>(seen); });
  EXPECT_THROW(registry_.add("recording", [seen](Allocator&) { return std::make_unique<Recording>(seen); }),
               ConfigError);
  GradBucket b = bucket(7, 333, 1.0);
  registry_.make("recording", alloc_)->run(*comm_, b)->wait();
  EXPECT_EQ(seen->index, 7);
  EXPECT_EQ(seen->numel, 333);
  EXPECT_EQ(seen->data, b.grads.data());
  EXPECT_LT(worst_relative_error(b, 1.0), size() * 0x1p-23);
  try {
    registry_.make("powersgd", alloc_);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown comm hook 'powersgd'; registered: bf16_compress, fp16_compress, "
                                         "fp32, recording"),
              std::string::npos) << e.what();
  }
}

TEST_F(Hooks, MeshGroupsReduceLikeHybridShard) {
  const int shard = size() % 2 == 0 ? 2 : size();
  MeshGroups mesh = make_mesh(*comm_, shard);
  ASSERT_EQ(mesh.shard->size(), shard);
  ASSERT_EQ(mesh.replicate->size(), size() / shard);
  EXPECT_EQ(mesh.shard->rank(), rank() % shard);
  EXPECT_EQ(mesh.replicate->rank(), rank() / shard);
  // Reduce-scatter inside the shard group, all-reduce across replicas:
  // every rank ends with its shard of the sum over all ranks.
  const int64_t n = 5;
  Tensor in = Tensor::empty(alloc_, DType::kF32, {n * shard}, MemCategory::kOther);
  testing::fill(in, [&](int64_t i) { return testing::exact_value(rank(), i); });
  Tensor out = Tensor::empty(alloc_, DType::kF32, {n}, MemCategory::kOther);
  mesh.shard->reduce_scatter(in, out, {})->wait();
  mesh.replicate->all_reduce(out, out, {})->wait();
  EXPECT_TRUE(testing::equals_rounded(out, [&](int64_t i) {
    double s = 0;
    for (int r = 0; r < size(); ++r) s += testing::exact_value(r, (rank() % shard) * n + i);
    return s;
  }, "hybrid reduction"));
  if (size() == 3) {
    EXPECT_THROW(make_mesh(*comm_, 2), ConfigError);
  }
}

}  // namespace
}  // namespace mp

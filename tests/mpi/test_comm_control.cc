// The control plane of Communicator (Note [Control plane]): host values cross
// ranks exactly and in rank order, and agree() makes every rank throw when
// any rank failed. Also the argument checks every backend shares: they run
// once, in the base class, before any backend code.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "core/error.h"
#include "tests/mpi/comm_test_util.h"
#include "tests/mpi/mpi_test.h"

namespace mp {
namespace {

class ControlPlane : public testing::CommTest {
 protected:
  // With fingerprints: the host exchanges take part in the sequence.
  ControlPlane() : CommTest("control", CommOptions{.check_fingerprints = true}) {}
};

// Rank r's bytes: r + 1 copies of a byte that depends on r, including a zero
// byte, so lengths differ and nothing stops at a NUL; rank 1 sends nothing.
std::string bytes_of(int r) {
  if (r == 1) return std::string();
  std::string s(static_cast<size_t>(r) + 1, static_cast<char>('a' + r));
  s[0] = '\0';
  return s;
}

TEST_F(ControlPlane, AllGatherBytesKeepsEveryRanksLengthAndZeroBytes) {
  const std::vector<std::string> all = comm_->all_gather_bytes(bytes_of(rank()));
  ASSERT_EQ(static_cast<int>(all.size()), size());
  for (int r = 0; r < size(); ++r) EXPECT_EQ(all[static_cast<size_t>(r)], bytes_of(r)) << "rank " << r;
}

TEST_F(ControlPlane, BroadcastBytesGivesTheRootsBytes) {
  const int root = size() - 1;
  const std::string got = comm_->broadcast_bytes(rank() == root ? "from the root" : "ignored", root);
  EXPECT_EQ(got, "from the root");
  EXPECT_THROW(comm_->broadcast_bytes("x", size()), EnforceError);
}

TEST_F(ControlPlane, Int64AndDoubleArriveExactlyInRankOrder) {
  // 2^53 + 1 is not a double and not a float: an encoding would lose it.
  const int64_t big = (int64_t{1} << 53) + 1 + rank();
  const int64_t ints[2] = {big, -rank()};
  const std::vector<int64_t> all_ints = comm_->all_gather_int64(ints);
  const double d = 0.1 + std::ldexp(1.0, -50) * rank();  // differs in the low bits only
  const double doubles[1] = {d};
  const std::vector<double> all_doubles = comm_->all_gather_double(doubles);
  ASSERT_EQ(all_ints.size(), 2 * static_cast<size_t>(size()));
  ASSERT_EQ(all_doubles.size(), static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) {
    EXPECT_EQ(all_ints[2 * static_cast<size_t>(r)], (int64_t{1} << 53) + 1 + r);
    EXPECT_EQ(all_ints[2 * static_cast<size_t>(r) + 1], -r);
    EXPECT_EQ(all_doubles[static_cast<size_t>(r)], 0.1 + std::ldexp(1.0, -50) * r);
  }
}

TEST_F(ControlPlane, ReductionsAreExactAndTheSameOnEveryRank) {
  const int W = size();
  EXPECT_EQ(comm_->all_reduce_int64(int64_t{1} << 40, HostOp::kSum), (int64_t{1} << 40) * W);
  EXPECT_EQ(comm_->all_reduce_int64(rank() - 7, HostOp::kMin), -7);
  EXPECT_EQ(comm_->all_reduce_int64(rank() - 7, HostOp::kMax), W - 8);
  // The double sum in rank order, computed here in the same order in float64.
  const double mine = 1.0 / (3.0 + rank());
  double expected = 0;
  for (int r = 0; r < W; ++r) expected += 1.0 / (3.0 + r);
  EXPECT_EQ(comm_->all_reduce_double(mine, HostOp::kSum), expected);
  EXPECT_EQ(comm_->all_reduce_double(mine, HostOp::kMax), 1.0 / 3.0);
  EXPECT_EQ(comm_->all_reduce_double(mine, HostOp::kMin), 1.0 / (3.0 + (W - 1)));
  // NaN on the last rank propagates through max and min.
  const double nan_last = rank() == W - 1 ? std::numeric_limits<double>::quiet_NaN() : 1.0;
  EXPECT_TRUE(std::isnan(comm_->all_reduce_double(nan_last, HostOp::kMax)));
  EXPECT_TRUE(std::isnan(comm_->all_reduce_double(nan_last, HostOp::kMin)));
}

TEST_F(ControlPlane, AgreeThrowsOnEveryRankWithTheFailedRanksError) {
  const int failing = size() - 1;
  try {
    comm_->agree("the test step", [&] {
      if (rank() == failing) MP_THROW(ConfigError, "bad field on the last rank");
    });
    ADD_FAILURE() << "agree() returned on rank " << rank() << " though rank " << failing << " failed";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(e.agreed()) << "rank " << rank();
    const std::string what = e.what();
    EXPECT_NE(what.find("bad field on the last rank"), std::string::npos) << what;
    if (rank() != failing) {
      EXPECT_NE(what.find("the test step failed on rank " + std::to_string(failing)), std::string::npos) << what;
    }
  }
  // Non-config errors arrive as IoError on the others; a rank that failed
  // keeps its own type.
  try {
    comm_->agree("the io step", [&] {
      if (rank() == 0) throw std::runtime_error("disk full on rank 0");
    });
    ADD_FAILURE() << "agree() returned on rank " << rank();
  } catch (const IoError& e) {
    EXPECT_NE(rank(), 0);
    EXPECT_TRUE(e.agreed());
    EXPECT_NE(std::string(e.what()).find("the io step failed on rank 0: disk full on rank 0"), std::string::npos);
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(rank(), 0) << e.what();
  }
  // A ModelError (a host's callback) stays a ModelError on every rank.
  try {
    comm_->agree("the model step", [&] {
      if (rank() == failing) MP_THROW(ModelError, "callback raised on the last rank");
    });
    ADD_FAILURE() << "agree() returned on rank " << rank();
  } catch (const ModelError& e) {
    EXPECT_TRUE(e.agreed());
    EXPECT_NE(std::string(e.what()).find("callback raised on the last rank"), std::string::npos) << e.what();
  }
  // Nobody failed: nothing is thrown, and the communicator is still in step.
  EXPECT_NO_THROW(comm_->agree("a good step", [] {}));
  EXPECT_EQ(comm_->all_reduce_int64(1, HostOp::kSum), size());
}

// The argument rules are the base class's: every backend gets them. A few
// that the two backends had written differently.
TEST_F(ControlPlane, CollectiveArgumentsAreCheckedBeforeTheBackend) {
  Allocator alloc;
  const auto zeros = [&](DType t, int64_t n) { return Tensor::zeros(alloc, t, {n}, MemCategory::kOther); };
  const Tensor a = zeros(DType::kF32, 4);
  const Tensor b = zeros(DType::kBF16, 4);
  EXPECT_THROW(comm_->all_reduce(a, b), EnforceError);  // kWire needs equal dtypes
  ReduceOptions fp32;
  fp32.accumulate = ReduceAccumulate::kFp32;
  const Tensor bf16_in = zeros(DType::kBF16, 4);
  EXPECT_THROW(comm_->all_reduce(bf16_in, Tensor::wrap(bf16_in.data(), Device::cpu(), DType::kF32, {4}), fp32),
               EnforceError);  // in place, different dtypes
  // Zero elements alias nothing: an empty all_reduce into a wider dtype is fine.
  EXPECT_NO_THROW(comm_->all_reduce(Tensor::wrap(bf16_in.data(), Device::cpu(), DType::kBF16, {0}),
                                    Tensor::wrap(bf16_in.data(), Device::cpu(), DType::kF32, {0}), fp32)
                      ->wait());
  EXPECT_THROW(comm_->broadcast(a, -1), EnforceError);
  if (size() > 1) {
    EXPECT_THROW(comm_->all_gather(a, a), EnforceError);  // output must hold size() x input
  }
  ReduceOptions bad;
  bad.divide_factor = 0;
  EXPECT_THROW(comm_->reduce_scatter(zeros(DType::kF32, 4 * size()), a, bad), EnforceError);
}

}  // namespace
}  // namespace mp

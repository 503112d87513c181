// MPI communicator collectives, swept over dtypes, ops, awkward counts,
// in-place and out-of-place, on data whose answer is exactly representable:
// results are compared bit for bit with the float64 reference.
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "core/error.h"
#include "mp/config.h"
#include "tests/mpi/comm_test_util.h"
#include "tests/mpi/mpi_test.h"

namespace mp {
namespace {

using testing::equals_rounded;
using testing::exact_value;
using testing::fill;

// The largest count is smaller under sanitizers, which check memory, not
// numerics: the same code paths, a fraction of the time.
const int64_t kCounts[] = {0, 1, 7, 1000, (int64_t{1} << (MP_SANITIZE ? 16 : 20)) + 3};
const DType kReduceTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
const DType kAllTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

class Collectives : public testing::CommTest {
 protected:
  Collectives() : CommTest("world") {}

  // The expected reduction over ranks of exact_value(r, index).
  double reduced(int64_t index, ReduceOp op) const {
    double acc = exact_value(0, index);
    for (int r = 1; r < size(); ++r) {
      const double v = exact_value(r, index);
      acc = op == ReduceOp::kMax ? std::max(acc, v) : op == ReduceOp::kMin ? std::min(acc, v) : acc + v;
    }
    return op == ReduceOp::kAvg ? acc / size() : acc;
  }

  std::string label(const char* op, DType t, ReduceOp rop, int64_t n, bool in_place) const {
    return std::string(op) + " " + std::string(dtype_name(t)) + " " + std::string(reduce_op_name(rop)) +
           " n=" + std::to_string(n) + (in_place ? " in-place" : " out-of-place") + " on rank " +
           std::to_string(rank()) + "/" + std::to_string(size());
  }

  Allocator alloc_;
};

TEST_F(Collectives, AllReduce) {
  for (DType t : kReduceTypes) {
    for (ReduceOp op : kOps) {
      for (int64_t n : kCounts) {
        for (bool in_place : {false, true}) {
          Tensor in = Tensor::empty(alloc_, t, {n}, MemCategory::kOther);
          fill(in, [&](int64_t i) { return exact_value(rank(), i); });
          Tensor out = in_place ? in : Tensor::empty(alloc_, t, {n}, MemCategory::kOther);
          comm_->all_reduce(in, out, {op})->wait();
          ASSERT_TRUE(equals_rounded(out, [&](int64_t i) { return reduced(i, op); },
                                     label("all_reduce", t, op, n, in_place)));
        }
      }
    }
  }
}

TEST_F(Collectives, ReduceScatter) {
  for (DType t : kReduceTypes) {
    for (ReduceOp op : kOps) {
      for (int64_t n : kCounts) {
        for (bool in_place : {false, true}) {
          Tensor in = Tensor::empty(alloc_, t, {n * size()}, MemCategory::kOther);
          fill(in, [&](int64_t i) { return exact_value(rank(), i); });
          Tensor out = in_place ? in.flat(rank() * n, n) : Tensor::empty(alloc_, t, {n}, MemCategory::kOther);
          comm_->reduce_scatter(in, out, {op})->wait();
          ASSERT_TRUE(equals_rounded(out, [&](int64_t i) { return reduced(rank() * n + i, op); },
                                     label("reduce_scatter", t, op, n, in_place)));
        }
      }
    }
  }
}

TEST_F(Collectives, DivideFactorIsAppliedAfterTheAverage) {
  for (DType t : kReduceTypes) {
    Tensor x = Tensor::empty(alloc_, t, {1000}, MemCategory::kOther);
    fill(x, [&](int64_t i) { return exact_value(rank(), i); });
    comm_->all_reduce(x, x, {ReduceOp::kAvg, 4.0})->wait();
    ASSERT_TRUE(equals_rounded(x, [&](int64_t i) { return reduced(i, ReduceOp::kAvg) / 4.0; },
                               label("all_reduce /4", t, ReduceOp::kAvg, 1000, true)));
  }
}

TEST_F(Collectives, AllGatherBroadcastAllToAll) {
  for (DType t : kAllTypes) {
    for (int64_t n : kCounts) {
      for (bool in_place : {false, true}) {
        const std::string where = label("", t, ReduceOp::kSum, n, in_place);
        // all_gather
        Tensor out = Tensor::empty(alloc_, t, {n * size()}, MemCategory::kOther);
        Tensor in = in_place ? out.flat(rank() * n, n) : Tensor::empty(alloc_, t, {n}, MemCategory::kOther);
        fill(in, [&](int64_t i) { return exact_value(rank(), i); });
        comm_->all_gather(in, out)->wait();
        ASSERT_TRUE(equals_rounded(out, [&](int64_t i) { return exact_value(static_cast<int>(i / n), i % n); },
                                   "all_gather" + where));
        // broadcast from the last rank
        Tensor b = Tensor::empty(alloc_, t, {n}, MemCategory::kOther);
        fill(b, [&](int64_t i) { return exact_value(rank(), i); });
        comm_->broadcast(b, size() - 1)->wait();
        ASSERT_TRUE(equals_rounded(b, [&](int64_t i) { return exact_value(size() - 1, i); }, "broadcast" + where));
        // all_to_all: chunk j of rank i lands in chunk i of rank j
        Tensor a_in = Tensor::empty(alloc_, t, {n * size()}, MemCategory::kOther);
        fill(a_in, [&](int64_t i) { return exact_value(rank(), i); });
        Tensor a_out = in_place ? a_in : Tensor::empty(alloc_, t, {n * size()}, MemCategory::kOther);
        comm_->all_to_all(a_in, a_out)->wait();
        ASSERT_TRUE(equals_rounded(
            a_out, [&](int64_t i) { return exact_value(static_cast<int>(i / n), rank() * n + i % n); },
            "all_to_all" + where));
      }
    }
  }
}

// all_to_all_v: rank i sends rank j count(i, j) elements, some none; the
// chunks land back to back in rank order, every value exact. Bad counts
// are refused before anything is issued.
TEST_F(Collectives, AllToAllVMovesChunksOfAnySize) {
  const int n = size(), me = rank();
  auto count = [](int from, int to) { return static_cast<int64_t>((from * 5 + to * 3) % 4 * 7); };
  auto value = [](int from, int to, int64_t k) { return exact_value(from, to * 64 + k); };
  for (DType t : kAllTypes) {
    std::vector<int64_t> sends, recvs;
    int64_t sent = 0, received = 0;
    for (int j = 0; j < n; ++j) {
      sends.push_back(count(me, j));
      recvs.push_back(count(j, me));
      sent += sends.back();
      received += recvs.back();
    }
    Tensor in = Tensor::empty(alloc_, t, {sent + 3}, MemCategory::kOther);  // room to spare
    std::vector<double> want_in, want_out;
    for (int j = 0; j < n; ++j) {
      for (int64_t k = 0; k < sends[static_cast<size_t>(j)]; ++k) want_in.push_back(value(me, j, k));
      for (int64_t k = 0; k < recvs[static_cast<size_t>(j)]; ++k) want_out.push_back(value(j, me, k));
    }
    fill(in, [&](int64_t i) { return i < sent ? want_in[static_cast<size_t>(i)] : 0.0; });
    Tensor out = Tensor::zeros(alloc_, t, {received + 2}, MemCategory::kOther);
    comm_->all_to_all_v(in, sends, out, recvs)->wait();
    ASSERT_TRUE(equals_rounded(
        out, [&](int64_t i) { return i < received ? want_out[static_cast<size_t>(i)] : 0.0; },
        "all_to_all_v " + std::string(dtype_name(t))));
  }
  Tensor x = Tensor::zeros(alloc_, DType::kF32, {4}, MemCategory::kOther);
  std::vector<int64_t> too_many(static_cast<size_t>(n), 0);
  too_many[0] = 5;
  const std::vector<int64_t> none(static_cast<size_t>(n), 0), short_list(static_cast<size_t>(n) + 1, 0);
  EXPECT_THROW(comm_->all_to_all_v(x, too_many, x.flat(0, 0), none), EnforceError);
  EXPECT_THROW(comm_->all_to_all_v(x, short_list, x, none), EnforceError);
}

TEST_F(Collectives, WorkIsAsynchronousAndOrdered) {
  // Many collectives issued back to back complete in order on the comm thread.
  std::vector<Tensor> xs;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 20; ++k) {
    xs.push_back(Tensor::empty(alloc_, DType::kF32, {1000}, MemCategory::kOther));
    fill(xs.back(), [&](int64_t i) { return exact_value(rank(), i + k); });
    works.push_back(comm_->all_reduce(xs.back(), xs.back(), {}));
  }
  const WorkPtr fence = comm_->fence("after twenty all_reduces");
  fence->wait();
  for (int k = 0; k < 20; ++k) {
    EXPECT_TRUE(works[k]->is_completed()) << k;
    EXPECT_EQ(works[k]->info().sequence, static_cast<uint64_t>(k + 1));
    ASSERT_TRUE(equals_rounded(xs[k], [&](int64_t i) {
      double s = 0;
      for (int r = 0; r < size(); ++r) s += exact_value(r, i + k);
      return s;
    }, "queued all_reduce " + std::to_string(k)));
  }
  comm_->barrier()->wait();
}

TEST_F(Collectives, BadArgumentsAreRejectedBeforeAnythingIsSent) {
  Tensor a = Tensor::empty(alloc_, DType::kF32, {10}, MemCategory::kOther);
  Tensor b = Tensor::empty(alloc_, DType::kBF16, {10}, MemCategory::kOther);
  Tensor c = Tensor::empty(alloc_, DType::kF32, {7}, MemCategory::kOther);
  Tensor f8 = Tensor::empty(alloc_, DType::kF8E4M3, {10}, MemCategory::kOther);
  EXPECT_THROW(comm_->all_reduce(a, b, {}), EnforceError);
  EXPECT_THROW(comm_->all_reduce(a, c, {}), EnforceError);
  EXPECT_THROW(comm_->all_reduce(f8, f8, {}), ConfigError);
  EXPECT_THROW(comm_->all_gather(a, c), EnforceError);
  EXPECT_THROW(comm_->broadcast(a, size()), EnforceError);
  EXPECT_THROW(comm_->all_reduce(a, a, {ReduceOp::kSum, 0.0}), EnforceError);
  // Nothing was issued: the next collective is #1 everywhere.
  EXPECT_EQ(comm_->barrier()->info().sequence, 1u);
}

}  // namespace
}  // namespace mp

// GPU tests of the staged MPI communicator (comm/mpi/staged_communicator.h;
// CTest label "gpu", run on 2 ranks that may share one GPU; every test skips
// without a device). Each collective on CUDA tensors through the staged
// backend gives exactly the bytes that MpiCommunicator gives on the same
// host data: every dtype, op, reduce_accumulate, divide factor, awkward
// count, in place and out of place. Plus the order on stream() (a comm
// hook's casts around the collective), Work::wait_on a compute stream, the
// inner sequence numbers, barrier, fence, split, the control plane and the
// staging buffer's accounting; and that nothing waits for ever (Note
// [Staged collectives]): hundreds of collectives back to back on two
// staged communicators, interleaved with compute on their streams, both
// with the device waiting for the MPI parts and with the host waiting,
// against exactly known answers within a deadline, and an issue that
// returns while a peer is late. Every copy between host and device here
// has a pinned host side (core/pinned.h).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/hooks.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/staged_communicator.h"
#include "core/cuda_host_word.h"
#include "core/device.h"
#include "core/pinned.h"
#include "core/tensor.h"
#include "kernels/convert_math.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu_comm.h"
#include "tests/mpi/mpi_test.h"

namespace mp {
namespace {

const int64_t kCounts[] = {0, 1, 7, 1000, (int64_t{1} << 20) + 3};
const DType kReduceTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
const DType kAllTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

class Staged : public testing::MpiTest {
 protected:
  void SetUp() override {
    MpiTest::SetUp();
    const CudaInfo info = cuda_info();
    if (info.device_count == 0) GTEST_SKIP() << "no CUDA device: " << info.unavailable_reason;
    // Ranks share the GPUs there are: the case the staged backend is for.
    device_ = Device::cuda(rank() % info.device_count);
    set_current_device(device_);
    device_alloc_ = Allocator(device_);
    reference_ = MpiCommunicator::create_world("reference", testing::gpu_test_comm_options());
    staged_ = StagedMpiCommunicator::create(MpiCommunicator::create_world("staged", testing::gpu_test_comm_options()),
                                            device_);
  }
  void TearDown() override {
    staged_.reset();
    reference_.reset();
    MpiTest::TearDown();
  }

  // n elements of t on this rank's host: random signs and magnitudes
  // (inexact sums, so the order of rounding shows), with zeros, a NaN and an
  // Inf among the first elements.
  Tensor host_data(DType t, int64_t n, uint32_t salt) {
    Tensor x = Tensor::empty(host_, t, {n}, MemCategory::kOther);
    std::mt19937 rng(static_cast<uint32_t>(rank()) * 7919u + salt);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
      float v = std::ldexp(u(rng), static_cast<int>(rng() % 12) - 6);
      if (i == 3) v = 0.0f;
      if (i == 5 && rank() == 0) v = std::nanf("");
      if (i == 6) v = rank() == 0 ? INFINITY : 1.0f;
      dispatch_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        static_cast<T*>(x.data())[i] = math::from_f32<T>(v);
      });
    }
    return x;
  }
  Tensor host_zeros(DType t, int64_t n) { return Tensor::zeros(host_, t, {n}, MemCategory::kOther); }

  // Copies h into device memory at `d` on `s`, through pinned memory
  // (core/pinned.h), and waits (bounded) for `s` before the pinned copy is
  // freed.
  void upload(void* d, const Tensor& h, Stream& s) {
    PinnedBuffer pinned(device_, h.size_bytes());
    if (h.size_bytes() > 0) std::memcpy(pinned.data(), h.data(), h.size_bytes());
    ops::copy_bytes(d, device_, pinned.data(), Device::cpu(), static_cast<int64_t>(h.size_bytes()), s);
    s.synchronize();
  }
  // Issued on `s` after what is there (the collectives, on stream()): sees its results.
  Tensor download(const Tensor& d, Stream& s) {
    PinnedBuffer pinned(device_, d.size_bytes());
    ops::copy_bytes(pinned.data(), Device::cpu(), d.data(), device_, static_cast<int64_t>(d.size_bytes()), s);
    s.synchronize();
    Tensor h = Tensor::empty(host_, d.dtype(), {d.numel()}, MemCategory::kOther);
    if (h.size_bytes() > 0) std::memcpy(h.data(), pinned.data(), h.size_bytes());
    return h;
  }
  // Copies through the staged stream, so the collectives are ordered after
  // them (Note [Staged collectives]).
  Tensor to_device(const Tensor& h) {
    Tensor d = Tensor::empty(device_alloc_, h.dtype(), {h.numel()}, MemCategory::kOther);
    upload(d.data(), h, staged_->stream());
    return d;
  }
  Tensor to_host(const Tensor& d) { return download(d, staged_->stream()); }

  std::string label(const std::string& op, DType t, int64_t n, bool in_place) const {
    return op + " " + std::string(dtype_name(t)) + " n=" + std::to_string(n) +
           (in_place ? " in-place" : " out-of-place") + " on rank " + std::to_string(rank());
  }

  Device device_;
  Allocator host_;
  Allocator device_alloc_;
  std::unique_ptr<MpiCommunicator> reference_;
  std::unique_ptr<StagedMpiCommunicator> staged_;
};

// Whether element i of t is a NaN (floating dtypes).
bool is_nan_at(const Tensor& t, int64_t i) {
  bool nan = false;
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    nan = std::isnan(math::to_f32(static_cast<const T*>(t.data())[i]));
  });
  return nan;
}

// Bit for bit; with `any_nan`, a NaN equals any NaN: arithmetic on the
// device (a hook's division and casts) yields the canonical NaN, where the
// host's keeps the payload.
::testing::AssertionResult same_bytes(const Tensor& got, const Tensor& want, const std::string& what,
                                      bool any_nan = false) {
  if (got.dtype() != want.dtype() || got.numel() != want.numel()) {
    return ::testing::AssertionFailure() << what << ": " << got.describe() << " vs " << want.describe();
  }
  const size_t es = dtype_size(got.dtype());
  for (int64_t i = 0; i < got.numel(); ++i) {
    const char* g = static_cast<const char*>(got.data()) + static_cast<size_t>(i) * es;
    const char* w = static_cast<const char*>(want.data()) + static_cast<size_t>(i) * es;
    if (std::memcmp(g, w, es) == 0 || (any_nan && is_nan_at(got, i) && is_nan_at(want, i))) continue;
    return ::testing::AssertionFailure() << what << ": element " << i << " differs";
  }
  return ::testing::AssertionSuccess();
}

TEST_F(Staged, ReportsItsShape) {
  EXPECT_EQ(staged_->rank(), rank());
  EXPECT_EQ(staged_->size(), size());
  EXPECT_EQ(staged_->device(), device_);
  EXPECT_EQ(staged_->name(), "staged");
  EXPECT_EQ(staged_->stream().device(), device_);
}

TEST_F(Staged, AllReduceAndReduceScatterEqualMpiBitForBit) {
  for (DType t : kReduceTypes) {
    for (ReduceOp op : kOps) {
      for (ReduceAccumulate acc : {ReduceAccumulate::kWire, ReduceAccumulate::kFp32}) {
        for (int64_t n : kCounts) {
          for (bool in_place : {false, true}) {
            const ReduceOptions o{op, n % 2 ? 3.0 : 1.0, acc};
            // kFp32 may write a wider output: bf16 and fp16 into fp32 out of place.
            const DType out_t = acc == ReduceAccumulate::kFp32 && !in_place ? DType::kF32 : t;
            const std::string what = std::string(reduce_op_name(op)) +
                                     (acc == ReduceAccumulate::kFp32 ? " fp32-accumulated " : " wire ");

            Tensor want_in = host_data(t, n, 1);
            Tensor want = in_place ? want_in : host_zeros(out_t, n);
            reference_->all_reduce(want_in, want, o)->wait();
            Tensor in = to_device(host_data(t, n, 1));
            Tensor out = in_place ? in : to_device(host_zeros(out_t, n));
            staged_->all_reduce(in, out, o)->wait();
            ASSERT_TRUE(same_bytes(to_host(out), want, label("all_reduce " + what, t, n, in_place)));

            Tensor rs_in = host_data(t, n * size(), 2);
            Tensor rs_want = in_place ? rs_in.flat(rank() * n, n) : host_zeros(out_t, n);
            reference_->reduce_scatter(rs_in, rs_want, o)->wait();
            Tensor d_in = to_device(host_data(t, n * size(), 2));
            Tensor d_out = in_place ? d_in.flat(rank() * n, n) : to_device(host_zeros(out_t, n));
            staged_->reduce_scatter(d_in, d_out, o)->wait();
            ASSERT_TRUE(same_bytes(to_host(d_out), rs_want, label("reduce_scatter " + what, t, n, in_place)));
          }
        }
      }
    }
  }
}

TEST_F(Staged, AllGatherBroadcastAndAllToAllEqualMpiBitForBit) {
  for (DType t : kAllTypes) {
    for (int64_t n : kCounts) {
      for (bool in_place : {false, true}) {
        // all_gather: in place when the input is this rank's slice of the output.
        Tensor want = host_zeros(t, n * size());
        Tensor want_in = in_place ? want.flat(rank() * n, n) : host_data(t, n, 3);
        if (in_place) std::memcpy(want_in.data(), host_data(t, n, 3).data(), want_in.size_bytes());
        reference_->all_gather(want_in, want)->wait();
        Tensor out = to_device(host_zeros(t, n * size()));
        Tensor in = in_place ? out.flat(rank() * n, n) : to_device(host_data(t, n, 3));
        if (in_place) upload(in.data(), host_data(t, n, 3), staged_->stream());
        staged_->all_gather(in, out)->wait();
        ASSERT_TRUE(same_bytes(to_host(out), want, label("all_gather", t, n, in_place)));

        // all_to_all: in place when input and output alias.
        Tensor a_want_in = host_data(t, n * size(), 4);
        Tensor a_want = in_place ? a_want_in : host_zeros(t, n * size());
        reference_->all_to_all(a_want_in, a_want)->wait();
        Tensor a_in = to_device(host_data(t, n * size(), 4));
        Tensor a_out = in_place ? a_in : to_device(host_zeros(t, n * size()));
        staged_->all_to_all(a_in, a_out)->wait();
        ASSERT_TRUE(same_bytes(to_host(a_out), a_want, label("all_to_all", t, n, in_place)));

        // all_to_all_v: rank i sends rank j (i + j + 1) * n / 3 elements.
        if (in_place) continue;
        std::vector<int64_t> sends, recvs;
        int64_t sent = 0, received = 0;
        for (int j = 0; j < size(); ++j) {
          sends.push_back((rank() + j + 1) * n / 3);
          recvs.push_back((j + rank() + 1) * n / 3);
          sent += sends.back();
          received += recvs.back();
        }
        Tensor v_want = host_zeros(t, received);
        reference_->all_to_all_v(host_data(t, sent, 6), sends, v_want, recvs)->wait();
        Tensor v_out = to_device(host_zeros(t, received));
        staged_->all_to_all_v(to_device(host_data(t, sent, 6)), sends, v_out, recvs)->wait();
        ASSERT_TRUE(same_bytes(to_host(v_out), v_want, label("all_to_all_v", t, n, in_place)));
      }
      for (int root : {0, size() - 1}) {
        Tensor want = host_data(t, n, 5);
        reference_->broadcast(want, root)->wait();
        Tensor b = to_device(host_data(t, n, 5));
        staged_->broadcast(b, root)->wait();
        ASSERT_TRUE(same_bytes(to_host(b), want, label("broadcast from " + std::to_string(root), t, n, true)));
      }
    }
  }
}

// The bf16_compress hook casts on stream() before and after its all-reduce
// and returns a fence: only the order on stream() makes it right. The hooks'
// arithmetic runs on the device here and on the host in the reference, so
// a NaN's payload may differ (same_bytes' any_nan).
TEST_F(Staged, HookCastsOnTheStreamAreOrderedWithTheCollective) {
  CommHookRegistry registry;
  for (const char* name : {"fp32", "bf16_compress", "fp16_compress"}) {
    Allocator host_scratch, device_scratch(device_);
    auto reference_hook = registry.make(name, host_scratch);
    auto staged_hook = registry.make(name, device_scratch);
    for (int index = 0; index < 3; ++index) {
      Tensor want = host_data(DType::kF32, 4099 + index, 6 + static_cast<uint32_t>(index));
      reference_hook->run(*reference_, GradBucket{index, want})->wait();
      Tensor grads = to_device(host_data(DType::kF32, 4099 + index, 6 + static_cast<uint32_t>(index)));
      staged_hook->run(*staged_, GradBucket{index, grads})->wait();
      ASSERT_TRUE(same_bytes(to_host(grads), want, std::string(name) + " bucket " + std::to_string(index),
                             /*any_nan=*/true));
    }
  }
}

TEST_F(Staged, WorksOrderComputeStreamsAndCarryTheInnerSequence) {
  Tensor x = to_device(host_data(DType::kBF16, 1000, 7));
  WorkPtr a = staged_->all_reduce(x, x, {});
  WorkPtr b = staged_->barrier();
  const std::vector<int64_t> ranks = staged_->all_gather_int64(std::vector<int64_t>{rank()});
  WorkPtr c = staged_->broadcast(x, 0);
  WorkPtr f = staged_->fence("after broadcast");
  EXPECT_EQ(a->info().op, "all_reduce");
  EXPECT_EQ(a->info().sequence, 1u);
  EXPECT_EQ(b->info().op, "barrier");
  EXPECT_EQ(b->info().sequence, 2u);
  EXPECT_EQ(c->info().sequence, 4u) << "the control-plane exchange took #3";
  EXPECT_EQ(f->info().op, "after broadcast");
  EXPECT_EQ(f->info().sequence, 4u);
  for (int r = 0; r < size(); ++r) EXPECT_EQ(ranks[static_cast<size_t>(r)], r);
  f->wait();
  EXPECT_TRUE(a->is_completed() && b->is_completed() && c->is_completed());

  // A compute stream waits on the device for a collective: no host wait.
  Tensor y = to_device(host_data(DType::kF32, 100003, 8));
  Tensor want = host_data(DType::kF32, 100003, 8);
  reference_->all_reduce(want, want, {ReduceOp::kAvg})->wait();
  auto compute = Stream::create(device_, "compute");
  WorkPtr d = staged_->all_reduce(y, y, {ReduceOp::kAvg});
  d->wait_on(*compute);
  EXPECT_TRUE(same_bytes(download(y, *compute), want, "all_reduce avg read on a compute stream after wait_on"));
}

TEST_F(Staged, ControlPlaneAndSplit) {
  const std::string mine(static_cast<size_t>(13 * rank()), static_cast<char>('a' + rank()));
  const std::vector<std::string> all = staged_->all_gather_bytes(mine);
  ASSERT_EQ(all.size(), static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) {
    EXPECT_EQ(all[static_cast<size_t>(r)], std::string(static_cast<size_t>(13 * r), static_cast<char>('a' + r)));
  }
  EXPECT_EQ(staged_->broadcast_bytes(rank() == 0 ? "from the root" : "", 0), "from the root");
  EXPECT_EQ(staged_->all_reduce_double(0.1 * (rank() + 1), HostOp::kMax), 0.1 * size());
  EXPECT_THROW(staged_->agree("a check", [&] {
    if (rank() == size() - 1) MP_THROW(ConfigError, "bad value");
  }),
               Error);

  // Every rank in one child, ordered by reversed rank; then a child of only rank 0.
  std::unique_ptr<Communicator> child = staged_->split(0, size() - rank(), "child");
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->size(), size());
  EXPECT_EQ(child->rank(), size() - 1 - rank());
  EXPECT_EQ(child->device(), device_);
  EXPECT_NE(dynamic_cast<StagedMpiCommunicator*>(child.get()), nullptr);
  Tensor want = host_data(DType::kF16, 777, 9);
  reference_->all_reduce(want, want, {ReduceOp::kSum})->wait();
  Tensor x = Tensor::empty(device_alloc_, DType::kF16, {777}, MemCategory::kOther);
  upload(x.data(), host_data(DType::kF16, 777, 9), child->stream());
  child->all_reduce(x, x, {ReduceOp::kSum})->wait();
  EXPECT_TRUE(same_bytes(download(x, child->stream()), want, "all_reduce on the split"));
  child.reset();

  std::unique_ptr<Communicator> alone = staged_->split(rank() == 0 ? 0 : -1, 0, "alone");
  EXPECT_EQ(alone != nullptr, rank() == 0);
  if (alone) {
    EXPECT_EQ(alone->size(), 1);
  }
}

TEST_F(Staged, StagingIsAccountedAndGrowsToTheLargestCollective) {
  EXPECT_EQ(staged_->memory().current(MemCategory::kCommScratch), 0u) << "nothing staged yet";
  Tensor small = to_device(host_data(DType::kF32, 10, 10));
  staged_->all_reduce(small, small, {})->wait();
  const size_t granule = size_t{2} << 20;
  EXPECT_EQ(staged_->memory().current(MemCategory::kCommScratch), granule);
  // 3M fp32 out of place: 12 MiB in, 12 MiB out.
  const int64_t n = 3 << 20;
  Tensor in = to_device(host_data(DType::kF32, n, 11));
  Tensor out = to_device(host_zeros(DType::kF32, n));
  staged_->all_reduce(in, out, {})->wait();
  EXPECT_EQ(staged_->memory().current(MemCategory::kCommScratch), 12 * granule);
  EXPECT_EQ(staged_->memory().live_allocations, 1u) << "one staging buffer at a time";
  staged_->all_reduce(small, small, {})->wait();
  EXPECT_EQ(staged_->memory().total_allocations, 2u) << "a smaller collective reuses it";

  // Sized once up front.
  auto sized = StagedMpiCommunicator::create(MpiCommunicator::create_world("sized", testing::gpu_test_comm_options()),
                                             device_, 5 << 20);
  EXPECT_EQ(sized->memory().current(MemCategory::kCommScratch), 3 * granule);
}

// The wait modes every rank can run: the device's where every rank's
// device can wait on host words (Note [Device waits on host words]), and
// always the host's.
std::vector<StagedWait> wait_modes(Communicator& comm, Device device) {
  const bool device_waits = comm.all_reduce_double(HostWord::supported(device) ? 1.0 : 0.0, HostOp::kMin) == 1.0;
  if (device_waits) return {StagedWait::kDevice, StagedWait::kHost};
  return {StagedWait::kHost};
}

const char* mode_name(StagedWait w) { return w == StagedWait::kDevice ? "device waits" : "host waits"; }

// Note [Staged collectives], "Why no wait is for ever": hundreds of
// collectives back to back on two staged communicators (so every switch
// between them waits for the other's last), with compute on their streams
// between them, issued without a host wait in between. Each step adds
// rank + 1 to every element on the device, then takes the maximum over the
// ranks: after k steps every element is exactly k x size() on every rank.
// `a` does it with an all_reduce, `b` with a reduce_scatter and an
// all_gather in place. The whole run must finish within a deadline, well
// inside the collectives' timeout (tests/gpu/gpu_comm.h).
TEST_F(Staged, BackToBackCollectivesWithComputeBetweenThemFinishInTime) {
  constexpr int kSteps = 300;
  constexpr double kDeadlineSeconds = 60;
  const int64_t n = 4099;
  const int W = size();
  for (StagedWait mode : wait_modes(*reference_, device_)) {
    const std::string what = std::string(mode_name(mode)) + " on rank " + std::to_string(rank());
    auto a = StagedMpiCommunicator::create(
        MpiCommunicator::create_world("back to back a", testing::gpu_test_comm_options()), device_, 0, mode);
    auto b = StagedMpiCommunicator::create(
        MpiCommunicator::create_world("back to back b", testing::gpu_test_comm_options()), device_, 0, mode);
    ASSERT_EQ(a->device_waits(), mode == StagedWait::kDevice) << what;
    Tensor inc_h = Tensor::empty(host_, DType::kF32, {n * W}, MemCategory::kOther);
    for (int64_t i = 0; i < n * W; ++i) inc_h.data_as<float>()[i] = static_cast<float>(rank() + 1);
    Tensor x = Tensor::empty(device_alloc_, DType::kF32, {n}, MemCategory::kOther);
    Tensor y = Tensor::empty(device_alloc_, DType::kF32, {n * W}, MemCategory::kOther);
    Tensor inc_a = Tensor::empty(device_alloc_, DType::kF32, {n}, MemCategory::kOther);
    Tensor inc_b = Tensor::empty(device_alloc_, DType::kF32, {n * W}, MemCategory::kOther);
    ops::zero(x, a->stream());
    upload(inc_a.data(), inc_h.flat(0, n), a->stream());
    ops::zero(y, b->stream());
    upload(inc_b.data(), inc_h, b->stream());

    const auto t0 = std::chrono::steady_clock::now();
    WorkPtr last_a, last_b;
    for (int k = 0; k < kSteps; ++k) {
      ops::accumulate(x, inc_a, false, a->stream());  // compute on a's stream, between its collectives
      last_a = a->all_reduce(x, x, {ReduceOp::kMax});
      ops::accumulate(y, inc_b, false, b->stream());
      b->reduce_scatter(y, y.flat(rank() * n, n), {ReduceOp::kMax});
      last_b = b->all_gather(y.flat(rank() * n, n), y);
    }
    const double issued_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    last_a->wait();
    last_b->wait();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(seconds, kDeadlineSeconds) << what << ": " << 3 * kSteps << " collectives";
    RecordProperty(std::string(mode == StagedWait::kDevice ? "device" : "host") + "_waits_seconds",
                   std::to_string(seconds));
    RecordProperty(std::string(mode == StagedWait::kDevice ? "device" : "host") + "_waits_issue_seconds",
                   std::to_string(issued_s));
    EXPECT_NO_THROW(a->barrier()->wait()) << what << ": a failure of an MPI part surfaces at the next call";
    EXPECT_NO_THROW(b->barrier()->wait()) << what;
    const float want = static_cast<float>(kSteps * W);
    const Tensor xs = download(x, a->stream()), ys = download(y, b->stream());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(xs.data_as<float>()[i], want) << what << ": x[" << i << "]";
    for (int64_t i = 0; i < n * W; ++i) ASSERT_EQ(ys.data_as<float>()[i], want) << what << ": y[" << i << "]";
  }
}

// With device waits the issuing thread never waits for a peer: while the
// last rank is late, the others' all_reduce returns at once, its Work is
// pending, and it completes once the late rank joins.
TEST_F(Staged, AnIssueReturnsWhileAPeerIsLate) {
  if (size() < 2) GTEST_SKIP() << "needs a second rank";
  if (wait_modes(*reference_, device_).front() != StagedWait::kDevice) {
    GTEST_SKIP() << "streams on " << device_ << " cannot wait on host words";
  }
  Tensor x = to_device(host_data(DType::kF32, 1000, 12));
  staged_->all_reduce(x, x, {ReduceOp::kMax})->wait();  // the staging buffer is sized: no drain below
  reference_->barrier()->wait();
  const int late = size() - 1;
  if (rank() == late) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto t0 = std::chrono::steady_clock::now();
  WorkPtr w = staged_->all_reduce(x, x, {ReduceOp::kMax});
  const double issue_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rank() != late) {
    EXPECT_LT(issue_s, 0.5) << "the issue waited for rank " << late;
    EXPECT_FALSE(w->is_completed()) << "completed without rank " << late;
  }
  w->wait();
  EXPECT_TRUE(w->is_completed());
}

TEST_F(Staged, ArgumentErrorsAreTheCommunicatorsRules) {
  Tensor cpu = host_zeros(DType::kF32, 8);
  EXPECT_THROW(staged_->all_reduce(cpu, cpu, {}), EnforceError);  // CPU memory on a CUDA communicator
  Tensor f8 = to_device(host_zeros(DType::kF8E4M3, 8));
  EXPECT_THROW(staged_->all_reduce(f8, f8, {}), ConfigError);
  Tensor x = to_device(host_zeros(DType::kF32, 8));
  Tensor y = to_device(host_zeros(DType::kF32, 9));
  EXPECT_THROW(staged_->all_gather(x, y), EnforceError);
  EXPECT_THROW(staged_->all_reduce(x, x, {ReduceOp::kSum, 0.0}), EnforceError);
  // Nothing was issued: the next collective is #1 on every rank.
  EXPECT_EQ(staged_->barrier()->info().sequence, 1u);
}

}  // namespace
}  // namespace mp

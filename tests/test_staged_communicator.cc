// What of the staged MPI communicator (comm/mpi/staged_communicator.h) runs
// without a GPU: create() refuses, with a ConfigError that says why, a build
// without CUDA, a device that is not CUDA and a CUDA device that is not
// there; and the communication thread's part of Note [Staged collectives]
// (comm/mpi/staged_completion.h): the bounded wait for the copies to host
// memory, tested with an event that never completes, and the host word
// that tells the device a collective is over, raised for every collective
// in order whether it failed or not. Its collectives are tested on a GPU,
// on 2 ranks, in tests/gpu/test_gpu_staged.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi/staged_communicator.h"
#include "comm/mpi/staged_completion.h"
#include "core/device.h"
#include "core/error.h"
#include "core/host_wait.h"
#include "core/stream.h"
#include "mp/config.h"
#include "tests/fake_event.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::contains;
using testing::error_of;

// No inner communicator is needed: the device is checked first, so no MPI.
std::string create_error(Device device) {
  return error_of<ConfigError>([&] { StagedMpiCommunicator::create(nullptr, device); });
}

TEST(StagedMpiCommunicator, CreateSaysWhyItCannotRun) {
#if !MP_WITH_CUDA
  const std::string e = create_error(Device::cuda(0));
  EXPECT_TRUE(contains(e, "moves CUDA tensors (cuda:0) through host memory, but mp was built without CUDA")) << e;
  EXPECT_TRUE(contains(create_error(Device::cpu()), "mp was built without CUDA"));
#else
  const std::string cpu = create_error(Device::cpu());
  EXPECT_TRUE(contains(cpu, "the staged MPI communicator is for CUDA memory, got cpu")) << cpu;
  const CudaInfo info = cuda_info();
  if (info.device_count == 0) {
    const std::string e = create_error(Device::cuda(0));
    EXPECT_TRUE(contains(e, "needs cuda:0, but no CUDA device is usable: " + info.unavailable_reason)) << e;
  } else {
    const std::string e = create_error(Device::cuda(info.device_count));
    EXPECT_TRUE(contains(e, "CUDA device(s) exist")) << e;
    EXPECT_TRUE(contains(error_of<EnforceError>([] { StagedMpiCommunicator::create(nullptr, Device::cuda(0)); }),
                         "needs an inner MpiCommunicator, got none"));
  }
#endif
}

// ---- the communication thread's part (comm/mpi/staged_completion.h) -----------------

TEST(StagedCompletion, TheWaitForTheCopiesReturnsOnceTheyAreDone) {
  auto [staged, fake] = testing::fake_event(/*complete at query*/ 4);
  wait_until_staged(staged, seconds(60), "all_reduce (staged collective #1) on communicator 'w'");
  EXPECT_EQ(fake->queries(), 4);
  // Only the copies count: a failed host task on the stream the event was
  // recorded on does not stop the collective (the peers wait for it).
  CpuStream user("staged:w");
  user.submit([] { MP_THROW(ModelError, "a host task of the caller failed"); });
  const Event after_failure = user.record();
  EXPECT_NO_THROW(wait_until_staged(after_failure, seconds(60), "all_reduce (staged collective #2)"));
}

// In a child process: a wait that times out abandons the process's streams
// (core/stream.h), which must not leak into other tests.
TEST(StagedCompletion, CopiesThatNeverReachTheHostFailTheCollectiveWithinTheDeadline) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto never = testing::fake_event(0);
        const auto t0 = Clock::now();
        std::string message = "(no error)";
        try {
          wait_until_staged(never.first, milliseconds(200), "all_reduce (staged collective #7) on communicator 'w'");
        } catch (const CommError& e) {
          message = e.message();
        }
        const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
        std::fprintf(stderr, "%s | waited %.3f s, %lld queries, abandoned %d\n", message.c_str(), waited,
                     static_cast<long long>(never.second->queries()), cpu_streams_abandoned() ? 1 : 0);
        const bool ok = waited >= 0.2 && waited < 2.0 && cpu_streams_abandoned() && never.second->queries() < 5000;
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "all_reduce \\(staged collective #7\\) on communicator 'w': its input did not reach host memory within "
      "0\\.2 s .* this rank skips the collective");
}

TEST(StagedCompletion, TheHostWordOnlyRisesInCyclicOrder) {
  std::atomic<uint32_t> word{5};
  raise_host_word(word, 3);
  EXPECT_EQ(word.load(), 5u) << "never lowered";
  raise_host_word(word, 5);
  EXPECT_EQ(word.load(), 5u);
  raise_host_word(word, 6);
  EXPECT_EQ(word.load(), 6u);
  // cuStreamWaitValue32's order is cyclic: 1 comes after 0xFFFFFFFE.
  word = 0xFFFFFFFEu;
  raise_host_word(word, 1);
  EXPECT_EQ(word.load(), 1u);
  raise_host_word(word, 0xFFFFFFFFu);
  EXPECT_EQ(word.load(), 1u) << "0xFFFFFFFF comes before 1";
  // Writers racing (the communication thread and a destructor): the word
  // ends at the furthest value.
  word = 0;
  std::vector<std::thread> writers;
  for (uint32_t t = 0; t < 4; ++t) {
    writers.emplace_back([&word, t] {
      for (uint32_t v = 1 + t; v <= 4000; v += 4) raise_host_word(word, v);
    });
  }
  for (std::thread& w : writers) w.join();
  EXPECT_EQ(word.load(), 4000u);
}

// The communication thread of Note [Staged collectives] on the CPU: for
// each collective k, the wait for its copies, the collective, and the
// always-task that raises the word to k. Collective #2 fails (a
// fingerprint mismatch, say): its failure is kept for the next call, the
// thread skips #3 (it has failed), and still the word reaches 3, so a
// device waiting for #3 goes on.
TEST(StagedCompletion, EveryCollectiveIsSignalledInOrderFailedOrNot) {
  CpuStream comm("comm:w", StreamOptions{.inherits_failures = false});
  auto failure = std::make_shared<FirstFailure>();
  std::atomic<uint32_t> word{0};
  std::vector<uint32_t> signalled;  // written on the communication thread only
  std::vector<int> ran;
  for (uint32_t k = 1; k <= 3; ++k) {
    const Event staged = testing::fake_event(/*complete at query*/ 2).first;
    comm.submit([staged] { wait_until_staged(staged, seconds(60), "all_reduce"); });
    comm.submit([k, &ran] {
      if (k == 2) MP_THROW(CommError, "all_reduce #2: fingerprints differ");
      ran.push_back(static_cast<int>(k));
    });
    auto inner = std::make_shared<Work>(CollectiveInfo{"all_reduce", k, DType::kF32, 8}, comm.record(), "w",
                                        seconds(60), nullptr);
    comm.submit_always([inner, failure, &word, &signalled, k] {
      finish_staged(*inner, *failure, word, k);
      signalled.push_back(word.load());
    });
  }
  // What the device does: wait for the word to reach the last collective.
  ASSERT_TRUE(poll_until([&] { return word.load() == 3u; }, seconds(60)));
  EXPECT_THROW(comm.synchronize(), CommError);  // drains the thread too
  EXPECT_EQ(ran, (std::vector<int>{1})) << "#3 runs after no failure";
  EXPECT_EQ(signalled, (std::vector<uint32_t>{1, 2, 3}));
  ASSERT_NE(failure->get(), nullptr);
  EXPECT_TRUE(contains(error_of<CommError>([&] { std::rethrow_exception(failure->get()); }),
                       "all_reduce #2: fingerprints differ"));
}

// The same when the copies never reach host memory: the thread fails with
// the named timeout, skips the collective, and the word still rises, so
// nothing on the device waits for ever. A child process, as above.
TEST(StagedCompletion, ATimedOutWaitStillReleasesTheDevice) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        CpuStream comm("comm:w", StreamOptions{.inherits_failures = false});
        auto failure = std::make_shared<FirstFailure>();
        std::atomic<uint32_t> word{0};
        bool collective_ran = false;
        const Event staged = testing::fake_event(0).first;
        comm.submit([staged] { wait_until_staged(staged, milliseconds(200), "broadcast (staged collective #1)"); });
        comm.submit([&] { collective_ran = true; });
        auto inner = std::make_shared<Work>(CollectiveInfo{"broadcast", 1, DType::kF32, 8}, comm.record(), "w",
                                            seconds(60), nullptr);
        comm.submit_always([inner, failure, &word] { finish_staged(*inner, *failure, word, 1); });
        const bool released = poll_until([&] { return word.load() == 1u; }, seconds(30));
        std::string message = "(no failure)";
        if (failure->get() != nullptr) message = error_of<CommError>([&] { std::rethrow_exception(failure->get()); });
        std::fprintf(stderr, "%s | released %d, collective ran %d\n", message.c_str(), released ? 1 : 0,
                     collective_ran ? 1 : 0);
        std::_Exit(released && !collective_ran ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "broadcast \\(staged collective #1\\): its input did not reach host memory within 0\\.2 s");
}

}  // namespace
}  // namespace mp

// Note [Bounded host waits] (core/host_wait.h): poll_until gives up at its
// deadline without spinning, returns as soon as the query says done, and
// lets the query's errors through; a CUDA event's bounded wait is this
// loop around cudaEventQuery (core/cuda_stream.cc), tested here with an
// event that never completes, since no device is needed for the loop.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "core/host_wait.h"
#include "tests/fake_event.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TEST(HostWait, GivesUpAtTheDeadlineWithoutSpinning) {
  auto [event, fake] = testing::fake_event(/*never*/ 0);
  const Event& e = event;  // clang 14 captures no structured binding
  const auto t0 = Clock::now();
  EXPECT_FALSE(poll_until([&e] { return e.query(); }, milliseconds(100)));
  const double waited = seconds_since(t0);
  EXPECT_GE(waited, 0.1);
  EXPECT_LT(waited, 0.1 + 0.5) << "overshot the deadline";
  // Sleeps double up to 200 us: at most about 500 queries in 100 ms (fewer
  // where a sleep overshoots). A loop that spins would make hundreds of
  // thousands.
  EXPECT_LE(fake->queries(), 1000) << "polled " << fake->queries() << " times in " << waited << " s";
  EXPECT_GE(fake->queries(), 10);
}

TEST(HostWait, ReturnsAsSoonAsTheQuerySaysDone) {
  auto [event, fake] = testing::fake_event(/*complete at query*/ 5);
  const Event& e = event;
  const auto t0 = Clock::now();
  EXPECT_TRUE(poll_until([&e] { return e.query(); }, std::chrono::seconds(60)));
  EXPECT_EQ(fake->queries(), 5);
  EXPECT_LT(seconds_since(t0), 2.0) << "four short pauses, not the 60 s timeout";
  // Event::wait_for on it is the same loop.
  auto [later, later_fake] = testing::fake_event(3);
  EXPECT_TRUE(later.wait_for(std::chrono::seconds(60)));
  EXPECT_EQ(later_fake->queries(), 3);
}

TEST(HostWait, AZeroOrNegativeTimeoutIsOneQuery) {
  int calls = 0;
  const auto never = [&] {
    ++calls;
    return false;
  };
  EXPECT_FALSE(poll_until(never, std::chrono::nanoseconds(0)));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(poll_until(never, milliseconds(-5)));
  EXPECT_EQ(calls, 2);
}

TEST(HostWait, AnErrorOfTheQueryEndsTheWait) {
  int calls = 0;
  const auto t0 = Clock::now();
  EXPECT_THROW(poll_until(
                   [&]() -> bool {
                     if (++calls == 3) MP_THROW(CudaError, "Call to cudaEventQuery failed: an illegal address");
                     return false;
                   },
                   std::chrono::seconds(60)),
               CudaError);
  EXPECT_EQ(calls, 3);
  EXPECT_LT(seconds_since(t0), 1.0);
}

TEST(HostWait, SecondsAndTheReportOfAnAbandonedWait) {
  EXPECT_EQ(seconds_text(milliseconds(1500)), "1.5");
  EXPECT_EQ(seconds_text(std::chrono::minutes(5)), "300");
  EXPECT_EQ(kDefaultWaitTimeout, milliseconds(300000)) << "CommConfig.timeout_s' default";
  ::testing::internal::CaptureStderr();
  report_abandoned_wait("the work of CUDA stream 'compute' (cuda:0)", milliseconds(2500),
                        "the stream is left as it is");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(testing::contains(err,
                                "mp: the work of CUDA stream 'compute' (cuda:0) did not finish within 2.5 s; "
                                "the stream is left as it is\n"))
      << err;
}

}  // namespace
}  // namespace mp

// CPU streams and events: ordering, real concurrency, waits, failures.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/stream.h"

namespace mp {
namespace {

TEST(CpuStream, RunsTasksInOrder) {
  CpuStream s("order");
  std::vector<int> seen;
  for (int i = 0; i < 100; ++i) s.submit([&seen, i] { seen.push_back(i); });
  s.synchronize();
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[i], i);
}

TEST(CpuStream, TwoStreamsRunConcurrently) {
  // Each task waits for the other to start: only concurrent execution finishes.
  CpuStream a("a"), b("b");
  std::atomic<int> started{0};
  auto rendezvous = [&] {
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (started.load() < 2) {
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("no overlap");
      std::this_thread::yield();
    }
  };
  a.submit(rendezvous);
  b.submit(rendezvous);
  EXPECT_NO_THROW(a.synchronize());
  EXPECT_NO_THROW(b.synchronize());
}

TEST(CpuStream, WaitOrdersWorkAcrossStreams) {
  CpuStream producer("producer"), consumer("consumer");
  std::atomic<bool> release{false};
  int value = 0;
  producer.submit([&] {
    while (!release.load()) std::this_thread::yield();
    value = 42;
  });
  const Event produced = producer.record();
  consumer.wait(produced);
  int seen = -1;
  consumer.submit([&] { seen = value; });
  const Event consumed = consumer.record();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(produced.query());
  EXPECT_FALSE(consumed.query()) << "the consumer must wait for the producer's event";
  release = true;
  consumed.synchronize();
  EXPECT_TRUE(produced.query());
  EXPECT_EQ(seen, 42);
}

TEST(CpuStream, FailurePoisonsLaterWorkAndWaiters) {
  CpuStream s("failing"), downstream("downstream");
  const Event before = s.record();
  s.submit([] { MP_THROW(IoError, "disk on fire"); });
  bool ran_after = false;
  s.submit([&] { ran_after = true; });
  const Event after = s.record();
  EXPECT_NO_THROW(before.synchronize());
  EXPECT_THROW(after.synchronize(), IoError);
  EXPECT_THROW(s.synchronize(), IoError);
  EXPECT_FALSE(ran_after);
  downstream.wait(after);
  bool downstream_ran = false;
  downstream.submit([&] { downstream_ran = true; });
  try {
    downstream.synchronize();
    FAIL() << "the waiting stream did not fail";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("disk on fire"), std::string::npos);
  }
  EXPECT_FALSE(downstream_ran);
}

// A failed task's error keeps its type and gains the task's name; a stream
// that fails by waiting on it passes it on unchanged; rethrow_failure
// rethrows it without waiting; other exceptions arrive as EnforceError.
TEST(CpuStream, AFailedTaskIsNamedAndCarriedToTheHost) {
  CpuStream s("compute"), downstream("comm");
  EXPECT_NO_THROW(s.rethrow_failure());
  s.submit([] { MP_THROW(ConfigError, "token 99 outside [0, 64)"); }, TaskName{"embedding forward", "embed"});
  const Event after = s.record();
  downstream.wait(after);
  const std::string want = "token 99 outside [0, 64) [op 'embedding forward' of unit 'embed' on stream 'compute']";
  try {
    after.synchronize();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(e.from_stream_task());
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  try {
    s.rethrow_failure();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  try {
    downstream.synchronize();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("on stream 'comm'"), std::string::npos) << "named twice: " << e.what();
  }
  CpuStream other("other");
  other.submit([] { throw std::runtime_error("not ours"); });
  try {
    other.synchronize();
    FAIL() << "no error";
  } catch (const EnforceError& e) {
    EXPECT_NE(std::string(e.what()).find("unexpected exception: not ours [op 'host task' on stream 'other']"),
              std::string::npos)
        << e.what();
  }
}

// submit_always: bookkeeping that must run whatever became of the work
// before it (the end of a staged collective) runs after a failure, in
// order, where a normal task is skipped; the first failure stays the one
// the stream reports.
TEST(CpuStream, AnAlwaysTaskRunsAfterAFailureAndKeepsTheFirstError) {
  CpuStream s("comm");
  std::vector<std::string> ran;
  s.submit([&] { ran.push_back("before"); });
  s.submit([] { MP_THROW(CommError, "all_reduce #3 failed"); });
  s.submit([&] { ran.push_back("skipped"); });
  const Event failed = s.record();
  bool saw_failure = false;
  s.submit_always([&] {
    try {
      failed.synchronize();
    } catch (const CommError&) {
      saw_failure = true;
    }
    ran.push_back("always");
  });
  s.submit_always([] { MP_THROW(IoError, "a second failure"); });
  s.submit_always([&] { ran.push_back("always again"); });
  try {
    s.synchronize();
    FAIL() << "no error";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce #3 failed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ran, (std::vector<std::string>{"before", "always", "always again"}));
  EXPECT_TRUE(saw_failure) << "the always task learns the failure from the event it checks";
  // Without a failure it is an ordinary task, in order.
  CpuStream t("fine");
  std::vector<int> order;
  t.submit([&] { order.push_back(1); });
  t.submit_always([&] { order.push_back(2); });
  t.submit([&] { order.push_back(3); });
  EXPECT_NO_THROW(t.synchronize());
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(CpuStream, DestructorRunsSubmittedWork) {
  int done = 0;
  {
    CpuStream s("drain");
    for (int i = 0; i < 10; ++i) s.submit([&] { ++done; });
  }
  EXPECT_EQ(done, 10);
}

TEST(Stream, CreateGivesACpuStreamForTheCpu) {
  auto s = Stream::create(Device::cpu(), "made");
  EXPECT_EQ(s->device(), Device::cpu());
  EXPECT_EQ(s->name(), "made");
  EXPECT_TRUE(Event().query());
  s->wait(Event());
  s->synchronize();
}

}  // namespace
}  // namespace mp

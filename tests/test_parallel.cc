// core/parallel.h: the split covers [0, n) once, on aligned boundaries;
// errors come back to the caller; nested calls run inline; MP_NUM_THREADS.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace mp {
namespace {

TEST(ParallelFor, CoversEveryIndexOnceOnAlignedBoundaries) {
  for (int64_t n : {int64_t{1}, int64_t{63}, int64_t{64}, int64_t{1000}, int64_t{100003}}) {
    for (int threads : {1, 2, 3, 7}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::mutex mu;
      std::set<std::pair<int64_t, int64_t>> parts;
      parallel_for(n, threads, 64, [&](int64_t b, int64_t e) {
        {
          std::lock_guard<std::mutex> lock(mu);
          parts.insert({b, e});
        }
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << threads;
      EXPECT_LE(static_cast<int>(parts.size()), threads);
      for (const auto& [b, e] : parts) {
        EXPECT_EQ(b % 64, 0);
        EXPECT_TRUE(e == n || e % 64 == 0);
      }
    }
  }
}

TEST(ParallelFor, UsesSeveralThreadsAndRethrowsTheFirstError) {
  std::mutex mu;
  std::set<std::thread::id> ids;
  parallel_for(1 << 12, 3, 64, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_THROW(parallel_for(1 << 12, 3, 64,
                            [](int64_t b, int64_t) {
                              if (b > 0) throw std::runtime_error("part failed");
                            }),
               std::runtime_error);
  // The pool still works after an error.
  std::atomic<int64_t> sum{0};
  parallel_for(1000, 2, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
}

TEST(ParallelFor, NestedCallsRunInline) {
  std::atomic<int64_t> count{0};
  parallel_for(256, 2, 64, [&](int64_t b, int64_t e) {
    parallel_for(e - b, 2, 1, [&](int64_t bb, int64_t ee) { count += ee - bb; });
  });
  EXPECT_EQ(count.load(), 256);
}

TEST(ParallelFor, ThreadCountFromTheEnvironment) {
  ASSERT_EQ(setenv("MP_NUM_THREADS", "3", 1), 0);
  EXPECT_EQ(default_cpu_threads(), 3);
  ASSERT_EQ(setenv("MP_NUM_THREADS", "two", 1), 0);
  try {
    default_cpu_threads();
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MP_NUM_THREADS='two' is not a thread count"), std::string::npos);
  }
  ASSERT_EQ(unsetenv("MP_NUM_THREADS"), 0);
  EXPECT_GE(default_cpu_threads(), 1);
}

}  // namespace
}  // namespace mp

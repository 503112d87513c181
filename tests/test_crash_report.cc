// launch/crash_report.h: a crash leaves every thread's stack, symbolized,
// in the report file and on stderr, and the process still dies of its signal.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/parallel.h"
#include "launch/crash_report.h"
#include "mp/config.h"

namespace mp {
namespace {

std::atomic<bool> g_waiting{false};

// A second thread, parked in a frame of its own until the process dies.
[[gnu::noinline]] void wait_in_a_named_frame() {
  name_this_thread("waiter");
  g_waiting.store(true);
  for (;;) pause();
}

[[gnu::noinline]] void store_through_null_here() {
  volatile int* volatile p = nullptr;
  *p = 7;
}

[[gnu::noinline]] void abort_here() { std::abort(); }

// The death test's child: no core file, the report installed, the waiter
// started, then `crash`.
void crash_with_a_waiter(const std::string& path, void (*crash)()) {
  const rlimit none{0, 0};
  setrlimit(RLIMIT_CORE, &none);
  install_crash_report(path, "unit test");
  std::thread(wait_in_a_named_frame).detach();
  while (!g_waiting.load()) std::this_thread::yield();
  crash();
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The same path in the test and in its death test's child (which runs the
// test again from the start), empty.
std::string report_path(const char* name) {
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "mp_crash_report";
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir / name);
  return (dir / name).string();
}

class CrashReport : public testing::Test {
 protected:
  void SetUp() override {
    if (MP_SANITIZE) GTEST_SKIP() << "sanitizer builds leave these signals to the sanitizer's report";
    GTEST_FLAG_SET(death_test_style, "threadsafe");
  }
};

TEST_F(CrashReport, SegfaultReportsEveryThreadSymbolizedAndStillDies) {
  const std::string path = report_path("segv.txt");
  EXPECT_EXIT(crash_with_a_waiter(path, store_through_null_here), testing::KilledBySignal(SIGSEGV),
              "crash report: unit test");
  const std::string r = read_all(path);
  EXPECT_NE(r.find("signal SIGSEGV (11), code 1, address 0x0"), std::string::npos) << r;
  // The crashing frame and its caller, with file and line.
  EXPECT_NE(r.find("store_through_null_here() at "), std::string::npos) << r;
  EXPECT_NE(r.find("tests/test_crash_report.cc:"), std::string::npos) << r;
  EXPECT_NE(r.find("crash_with_a_waiter("), std::string::npos) << r;
  // The other thread, by name, in its own frame.
  EXPECT_NE(r.find("\"mp:waiter\":\n"), std::string::npos) << r;
  EXPECT_NE(r.find("wait_in_a_named_frame() at "), std::string::npos) << r;
  EXPECT_NE(r.find("=== end of crash report ==="), std::string::npos) << r;
}

TEST_F(CrashReport, AbortIsReportedAndStillAborts) {
  const std::string path = report_path("abort.txt");
  EXPECT_EXIT(crash_with_a_waiter(path, abort_here), testing::KilledBySignal(SIGABRT), "signal SIGABRT");
  const std::string r = read_all(path);
  EXPECT_NE(r.find("abort_here() at "), std::string::npos) << r;
  EXPECT_NE(r.find("wait_in_a_named_frame() at "), std::string::npos) << r;
}

// Without a path the report goes to stderr alone.
TEST_F(CrashReport, WithoutAPathStderrHasTheReport) {
  EXPECT_EXIT(crash_with_a_waiter("", store_through_null_here), testing::KilledBySignal(SIGSEGV),
              "store_through_null_here\\(\\) at [^\n]*tests/test_crash_report.cc:[0-9]+");
}

}  // namespace
}  // namespace mp

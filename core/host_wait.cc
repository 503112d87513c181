#include "core/host_wait.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace mp {

bool poll_until(const std::function<bool()>& ready, std::chrono::nanoseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::max(timeout, std::chrono::nanoseconds(0));
  std::chrono::microseconds pause(2);
  constexpr std::chrono::microseconds kLongestPause(200);
  for (;;) {
    if (ready()) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    // Never sleep past the deadline by more than one query's worth.
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
    std::this_thread::sleep_for(std::min({pause, kLongestPause, left + std::chrono::microseconds(1)}));
    pause = std::min(pause * 2, kLongestPause);
  }
}

std::string seconds_text(std::chrono::nanoseconds d) {
  std::ostringstream os;
  os << std::chrono::duration<double>(d).count();
  return os.str();
}

void report_abandoned_wait(const std::string& what, std::chrono::nanoseconds timeout,
                           const std::string& consequence) noexcept {
  try {
    const int rank = error_rank();
    const std::string prefix = rank >= 0 ? "[rank " + std::to_string(rank) + "] " : std::string();
    std::fprintf(stderr, "%smp: %s did not finish within %s s; %s\n", prefix.c_str(), what.c_str(),
                 seconds_text(timeout).c_str(), consequence.c_str());
  } catch (...) {
    // Out of memory while reporting: nothing more to say.
  }
}

}  // namespace mp

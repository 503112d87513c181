#include "core/error.h"

#include <atomic>

namespace mp {
namespace {

// Process identity, written once at start-up; not configuration state.
std::atomic<int> g_error_rank{-1};

std::string format(const char* file, int line, int rank, const std::string& message) {
  std::string out;
  if (rank >= 0) out += "[rank " + std::to_string(rank) + "] ";
  out += file;
  out += ':';
  out += std::to_string(line);
  out += ": ";
  out += message;
  return out;
}

}  // namespace

void set_error_rank(int rank) noexcept { g_error_rank.store(rank, std::memory_order_relaxed); }
int error_rank() noexcept { return g_error_rank.load(std::memory_order_relaxed); }

Error::Error(const char* file, int line, const std::string& message)
    : std::runtime_error(format(file, line, error_rank(), message)),
      message_(message),
      file_(file),
      line_(line),
      rank_(error_rank()) {}

namespace detail {

void throw_enforce(const char* file, int line, const std::string& what, const std::string& extra) {
  throw EnforceError(file, line, extra.empty() ? what : what + ". " + extra);
}

}  // namespace detail
}  // namespace mp

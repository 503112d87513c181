#include "comm/mpi/staged_completion.h"

#include <utility>

#include "core/error.h"
#include "core/host_wait.h"

namespace mp {

void FirstFailure::fail(std::exception_ptr e) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_) error_ = std::move(e);
}

std::exception_ptr FirstFailure::get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void wait_until_staged(const Event& staged, std::chrono::milliseconds timeout, const std::string& what) {
  if (poll_until([&] { return staged.query(); }, timeout)) return;
  abandon_cpu_streams();  // the communication thread stops here: teardown must not wait for it
  MP_THROW(CommError, what, ": its input did not reach host memory within ", seconds_text(timeout),
           " s (the copies to host memory wait behind work on the device that does not finish); this rank skips "
           "the collective, so its peers name it as missing");
}

void raise_host_word(std::atomic<uint32_t>& word, uint32_t value) noexcept {
  uint32_t current = word.load(std::memory_order_acquire);
  while (static_cast<int32_t>(value - current) > 0 &&
         !word.compare_exchange_weak(current, value, std::memory_order_release, std::memory_order_acquire)) {
  }
}

void finish_staged(const Work& inner, FirstFailure& failure, std::atomic<uint32_t>& word, uint32_t value) noexcept {
  try {
    // Complete by now (its event was recorded before this task was
    // submitted); wait_for rethrows its failure.
    if (!inner.event().wait_for(std::chrono::nanoseconds(0))) {
      MP_THROW(EnforceError, inner.info().describe(), " was still running when its completion was signalled");
    }
  } catch (...) {
    failure.fail(std::current_exception());
  }
  raise_host_word(word, value);
}

}  // namespace mp

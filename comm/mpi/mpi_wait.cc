#include "comm/mpi/mpi_wait.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "comm/mpi/mpi_error.h"

namespace mp {
namespace {

// How long a wait polls without sleeping: most of a training step's
// collectives complete within it, undelayed by a sleep (sleeping from the
// first missed poll cost a 2-rank GPT-2 step 10%).
constexpr auto kSpinWindow = std::chrono::milliseconds(5);
constexpr auto kPollSleep = std::chrono::microseconds(50);
constexpr size_t kCopySlice = size_t{1} << 20;

}  // namespace

void mpi_wait_all(int n, MPI_Request* reqs) {
  const auto spin_until = std::chrono::steady_clock::now() + kSpinWindow;
  for (;;) {
    int done = 0;
    MP_CHECK_MPI(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
    if (done) return;
    if (std::chrono::steady_clock::now() < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kPollSleep);
    }
  }
}

void mpi_copy_progressing(void* dst, const void* src, size_t bytes, int n, MPI_Request* reqs) {
  for (size_t b = 0; b < bytes; b += kCopySlice) {
    std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, std::min(kCopySlice, bytes - b));
    int done = 0;
    if (n > 0) MP_CHECK_MPI(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
  }
}

}  // namespace mp

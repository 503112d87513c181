#include "comm/mpi/mpi_wait.h"

#include <chrono>
#include <thread>

#include "comm/mpi/mpi_error.h"

namespace mp {
namespace {

// How long a wait polls without sleeping: most of a training step's
// collectives complete within it, undelayed by a sleep (sleeping from the
// first missed poll cost a 2-rank GPT-2 step 10%).
constexpr auto kSpinWindow = std::chrono::milliseconds(5);
constexpr auto kPollSleep = std::chrono::microseconds(50);

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

}  // namespace mp

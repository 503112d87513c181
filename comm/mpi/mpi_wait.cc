#include "comm/mpi/mpi_wait.h"

#include <chrono>
#include <thread>

#include "comm/mpi/mpi_error.h"

namespace mp {
namespace {

// Quick polls before the first sleep: a request that completes within
// microseconds is not delayed by one.
constexpr int kQuickPolls = 64;
constexpr auto kPollSleep = std::chrono::microseconds(50);

}  // namespace

void mpi_wait_all(int n, MPI_Request* reqs) {
  for (int polls = 0;; ++polls) {
    int done = 0;
    MP_CHECK_MPI(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
    if (done) return;
    if (polls < kQuickPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kPollSleep);
    }
  }
}

bool mpi_test(MPI_Request* req, MPI_Status* status) {
  int done = 0;
  MP_CHECK_MPI(MPI_Test(req, &done, status));
  return done != 0;
}

}  // namespace mp

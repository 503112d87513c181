#include "launch/rank_main.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "comm/rank_discovery.h"
#include "core/error.h"

namespace mp {
namespace {

// The line in one write(2): mpirun forwards each rank's stderr in the
// chunks it was written in, so a message written in two parts (the text,
// then the newline) could have another rank's message land in between.
void print_error_line(std::string line) {
  line += '\n';
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// Seconds MPI_Abort gets to end this process before it ends itself.
constexpr int kAbortGraceSeconds = 5;

// Ends every process of the job with `code`: the way out when one rank
// fails and the others may be waiting for it in a collective. MPI_Abort
// asks the launcher to kill the job; where the launcher cannot be reached
// (this host's link is down) it may never return, so a detached thread
// ends this rank after kAbortGraceSeconds: no rank outlives its error by
// more than that.
[[noreturn]] void abort_job(int code) {
  std::thread([code] {
    std::this_thread::sleep_for(std::chrono::seconds(kAbortGraceSeconds));
    print_error_line("[rank " + std::to_string(error_rank()) + "] MPI_Abort did not end this rank within " +
                     std::to_string(kAbortGraceSeconds) + " s (the launcher is unreachable?); exiting");
    std::_Exit(code);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

}  // namespace

int run_rank_main(const char* program, int* argc, char*** argv,
                  const std::function<int(const MpiWorld&)>& body) {
  std::unique_ptr<MpiWorld> world;
  try {
    world = std::make_unique<MpiWorld>(argc, argv);
    // Note [Rank discovery]: under torchrun, or srun without MPI, MPI's
    // world would be each process alone.
    check_world_size(discover_ranks(process_environment()), world->size(), "MPI's world");
    return body(*world);
  } catch (const Error& e) {
    print_error_line(e.what());
    const int code = dynamic_cast<const ConfigError*>(&e) ? 2 : 1;
    // An agreed error is thrown by every rank at the same point: each ends
    // normally (MPI_Finalize), after printing its own message. MPI_Abort
    // here could kill the other ranks before they print theirs.
    if (world && world->size() > 1 && !e.agreed()) abort_job(code);
    return code;
  } catch (const std::exception& e) {
    print_error_line("[rank " + std::to_string(error_rank()) + "] " + program + ": " + e.what());
    if (world && world->size() > 1) abort_job(1);
    return 1;
  }
}

}  // namespace mp

// comm/nccl/nccl_state.h: the NCCL communicator handle of one
// NcclCommunicator and what it shares with its Works' diagnosis, plus the
// small RAII helpers of the NCCL backend. Internal to comm/nccl: only
// nccl_*.cc include it (it needs nccl.h).
//
// Locking: `mu` is held around every NCCL call on `comm` (issue, init,
// destruction) and by the diagnosis, so a diagnosis running on another
// thread never aborts the communicator under a running call. Methods ending
// in _locked need it held.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "comm/nccl/nccl_error.h"
#include "comm/peer_report.h"
#include "comm/work.h"
#include "core/cuda_stream.h"
#include "core/device.h"
#include "core/error_cuda.h"

namespace mp {

class NcclState {
 public:
  NcclState(std::string name, std::chrono::milliseconds timeout, std::chrono::milliseconds reply_timeout)
      : name_(std::move(name)), timeout_(timeout), reply_timeout_(reply_timeout) {}

  std::timed_mutex& mutex() { return mu_; }
  ncclComm_t* comm_slot() { return &comm_; }  // for init only
  ncclComm_t comm() const { return comm_; }
  CommProgress& progress() { return *progress_; }
  const std::shared_ptr<CommProgress>& progress_ptr() const { return progress_; }

  // Timeouts name the ranks behind through `peers` (the host communicator's
  // Communicator::watch; empty: unknown).
  void set_peers(Work::Diagnose peers) { peers_ = std::move(peers); }

  // ncclCommAbort (once) and remember why; later calls throw CommError.
  void abort_locked(const std::string& reason);
  bool aborted_locked() const { return aborted_; }
  void throw_if_aborted_locked() const;
  // Polls the non-blocking communicator until it leaves ncclInProgress. On
  // an error, or when the timeout passes, aborts it and throws CommError
  // naming `what`.
  void wait_ready_locked(const std::string& what);
  // Remembers a collective's completion event, for the diagnosis.
  void track_locked(uint64_t sequence, Event done);
  // Collective-free close: ncclCommFinalize (polled, bounded) and
  // ncclCommDestroy when `drained`, otherwise (or if that fails)
  // ncclCommAbort. Never throws.
  void close_locked(bool drained) noexcept;

  // The Diagnose of every Work (comm/work.h): this rank's sequence numbers
  // (issued, enqueued, completed on the GPU), the NCCL async state and last
  // error, the peers behind; then it aborts the
  // communicator so the stuck kernels end. Takes the lock itself.
  std::string diagnose(const CollectiveInfo& info);

 private:
  std::string last_error_locked() const;
  void prune_locked();

  const std::string name_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds reply_timeout_;
  std::timed_mutex mu_;
  ncclComm_t comm_ = nullptr;  // null before init, after abort and after close
  bool aborted_ = false;
  std::string abort_reason_;
  std::shared_ptr<CommProgress> progress_ = std::make_shared<CommProgress>();
  std::deque<std::pair<uint64_t, Event>> in_flight_;  // collectives not yet seen complete
  uint64_t completed_ = 0;  // last sequence number whose event was seen complete
  bool dropped_ = false;    // in_flight_ overflowed: completed_ is a lower bound
  Work::Diagnose peers_;
};

// ncclGroupStart .. ncclGroupEnd. A group left by an exception (an NCCL
// call in it failed, which NCCL records as the group's error, so nothing is
// launched) is still ended, keeping the thread's group depth balanced.
class NcclGroup {
 public:
  NcclGroup() { MP_CHECK_NCCL(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ncclResult_t end() {
    open_ = false;
    return ncclGroupEnd();
  }

 private:
  bool open_ = true;
};

}  // namespace mp

// Checks an NCCL call's result, then waits until the non-blocking
// communicator has really put it on the stream (the caller holds the lock),
// so that work enqueued after it runs after it.
#define MP_NCCL_ENQUEUE(state, call)   \
  do {                                 \
    MP_CHECK_NCCL(call);               \
    (state).wait_ready_locked(#call);  \
  } while (0)

#include "comm/nccl/nccl_state.h"

#include <sstream>
#include <thread>

#include "core/error.h"

namespace mp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxTracked = size_t{1} << 14;  // in-flight events kept for the diagnosis

double seconds(std::chrono::milliseconds d) { return static_cast<double>(d.count()) / 1000.0; }

}  // namespace

void NcclState::abort_locked(const std::string& reason) {
  if (comm_ != nullptr) (void)ncclCommAbort(comm_);
  comm_ = nullptr;
  if (!aborted_) {
    aborted_ = true;
    abort_reason_ = reason;
  }
}

void NcclState::throw_if_aborted_locked() const {
  if (aborted_) {
    MP_THROW(CommError, "communicator '", name_, "' was aborted (", abort_reason_,
             ") and cannot be used again");
  }
}

std::string NcclState::last_error_locked() const {
  const char* e = comm_ != nullptr ? ncclGetLastError(comm_) : nullptr;
  return e != nullptr && *e != '\0' ? std::string(e) : std::string("no further detail");
}

void NcclState::wait_ready_locked(const std::string& what) {
  MP_ENFORCE(comm_ != nullptr, "no NCCL communicator for ", what);
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess) state = rc;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      const std::string detail = last_error_locked();
      abort_locked(what + " failed");
      MP_THROW(CommError, what, " on communicator '", name_, "' failed: ", ncclGetErrorString(state), " (",
               detail, "). The communicator was aborted.");
    }
    if (Clock::now() >= deadline) {
      abort_locked(what + " timed out");
      MP_THROW(CommError, what, " on communicator '", name_, "' did not complete within ", seconds(timeout_),
               " s. The communicator was aborted.");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclState::prune_locked() {
  try {
    while (!in_flight_.empty() && in_flight_.front().second.query()) {
      completed_ = in_flight_.front().first;
      in_flight_.pop_front();
    }
  } catch (const Error&) {
    // A CUDA error: the Work that waits on the event reports it.
  }
}

void NcclState::track_locked(uint64_t sequence, Event done) {
  prune_locked();
  if (in_flight_.size() >= kMaxTracked) {
    in_flight_.pop_front();
    dropped_ = true;
  }
  in_flight_.emplace_back(sequence, std::move(done));
}

void NcclState::close_locked(bool drained) noexcept {
  if (comm_ != nullptr) {
    bool closed = false;
    if (drained) {
      const ncclResult_t rc = ncclCommFinalize(comm_);
      ncclResult_t state = rc;
      const auto deadline = Clock::now() + timeout_;
      while (rc == ncclSuccess || rc == ncclInProgress) {
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
        if (state != ncclInProgress || Clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (state == ncclSuccess) closed = ncclCommDestroy(comm_) == ncclSuccess;
    }
    if (closed) {
      comm_ = nullptr;
    } else {
      abort_locked("the communicator did not drain when it was destroyed");
    }
  }
  if (!aborted_) {
    aborted_ = true;
    abort_reason_ = "the communicator was destroyed";
  }
}

std::string NcclState::diagnose(const CollectiveInfo& info) {
  std::ostringstream os;
  if (peers_) {
    try {
      os << peers_(info) << " ";
    } catch (const std::exception& e) {
      os << "(The peer monitor failed: " << e.what() << ") ";
    }
  } else {
    os << "(No peer monitor was given, so the ranks that did not arrive are unknown.) ";
  }
  std::unique_lock<std::timed_mutex> lock(mu_, std::defer_lock);
  if (!lock.try_lock_for(reply_timeout_)) {
    os << "This rank's host thread is inside an NCCL call on this communicator; that call aborts the "
          "communicator itself when its own timeout passes.";
    return os.str();
  }
  prune_locked();
  os << "This rank has issued up to #" << progress_->issued.load() << ", enqueued up to #"
     << progress_->started.load() << ", and its GPU has completed up to #" << completed_
     << (dropped_ ? " or later" : "") << ". ";
  if (comm_ != nullptr) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess) {
      os << "NCCL state: " << ncclGetErrorString(state);
      if (state != ncclSuccess && state != ncclInProgress) os << " (" << last_error_locked() << ")";
      os << ". ";
    }
  }
  if (aborted_) {
    os << "The communicator had already been aborted (" << abort_reason_ << ").";
  } else {
    abort_locked("timeout of " + info.describe());
    os << "The NCCL communicator has been aborted (ncclCommAbort): its kernels end, their outputs are "
          "undefined, and it cannot be used again.";
  }
  return os.str();
}

}  // namespace mp

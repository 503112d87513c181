// comm/mpi/staged_completion.h: what the communication thread does around
// a staged collective's MPI part (Note [Staged collectives] in
// comm/mpi/staged_communicator.h): wait, within bounds, for the copies to
// host memory, and afterwards tell the device, through a host word, that
// the collective is over and how it ended. Nothing here touches CUDA, so
// the CPU tests cover it (tests/test_staged_communicator.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>

#include "comm/work.h"
#include "core/stream.h"

namespace mp {

// The first failure of a staged communicator's MPI parts, shared with the
// tasks on its communication thread; rethrown by its next call.
class FirstFailure {
 public:
  void fail(std::exception_ptr e) noexcept;
  std::exception_ptr get() const;

 private:
  mutable std::mutex mu_;
  std::exception_ptr error_;
};

// Blocks until `staged` (the event after the copies to host memory) has
// completed, polling its query() (Note [Bounded host waits] in
// core/host_wait.h). A failure of the stream it was recorded on does not
// stop the collective (the inner communicator keeps in step with its
// peers, as its own waits do); at `timeout` it abandons the streams and
// throws CommError: "<what>: its input did not reach host memory within T
// s ...".
void wait_until_staged(const Event& staged, std::chrono::milliseconds timeout, const std::string& what);

// Raises `word` to `value` in the cyclic order of cuStreamWaitValue32
// ((int32_t)(value - word) > 0); never lowers it. Any thread.
void raise_host_word(std::atomic<uint32_t>& word, uint32_t value) noexcept;

// After the inner collective `inner` (on the communication thread, as a
// CpuStream::submit_always task, so its event has completed, with or
// without an error): keeps its failure in `failure`, then raises `word` to
// `value`, which lets the device copy the result back.
void finish_staged(const Work& inner, FirstFailure& failure, std::atomic<uint32_t>& word, uint32_t value) noexcept;

}  // namespace mp

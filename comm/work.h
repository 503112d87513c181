// comm/work.h: the handle of one asynchronous collective.
//
// Note [What completion means]
// Every collective is issued in call order onto its communicator's stream
// (Communicator::stream()) and returns a Work.
// - MPI backend (CPU memory): the stream is the communicator's
//   communication thread. Work is complete when the MPI call and our
//   post-processing (average, divide factor, fp32 accumulation) have returned
//   on that thread. From then on the output holds the result on this rank
//   and the input may be reused. wait() is then functionally equivalent to
//   the blocking MPI call.
// - NCCL backend (CUDA memory): the stream is the communicator's CUDA
//   stream. Work is complete when the device has finished the kernels, and
//   is_completed() polls an event. wait_on(stream) orders later work on a
//   compute stream after the collective with cudaStreamWaitEvent: no host
//   sync. wait(timeout) blocks the host and should be rare.
// In both backends, work issued to a communicator after a collective (hooks'
// casts, fence()) runs after it.
//
// Timeouts: wait() never blocks longer than its timeout (the communicator's
// default unless given). On timeout it throws CommError naming the
// collective, its per-communicator sequence number, the element count and
// dtype, and the ranks that have not issued or not started it, found
// through a side channel that answers even while a rank is stuck. The work
// stays pending; the communicator is usable again only if it later
// completes, so the usual reaction is to end the job (mp_worker does).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/stream.h"

namespace mp {

// What a collective was: used in errors and in debug fingerprints.
struct CollectiveInfo {
  std::string op;        // "all_reduce", "reduce_scatter", ...
  uint64_t sequence = 0; // 1-based per communicator, in issue order
  DType dtype = DType::kF32;
  int64_t count = 0;     // elements per rank as the op defines it (bytes for host_*)
  std::string describe() const;  // "all_reduce #42 (bf16 x 1000)"
};

class Work {
 public:
  using Clock = std::chrono::steady_clock;
  // Diagnoses a timeout: returns the text that names the missing ranks.
  using Diagnose = std::function<std::string(const CollectiveInfo&)>;

  Work(CollectiveInfo info, Event done, std::string communicator_name,
       std::chrono::milliseconds default_timeout, Diagnose diagnose);

  const CollectiveInfo& info() const { return info_; }
  bool is_completed() const { return done_.query(); }
  // Blocks until complete. Rethrows the collective's failure; throws
  // CommError after the timeout (see the note above).
  void wait() const { wait(default_timeout_); }
  void wait(std::chrono::milliseconds timeout) const;
  // After something that depends on this collective was waited for
  // `waited` in vain: returns if it completed (rethrowing its failure),
  // else throws the CommError wait(waited) would have.
  void check_after(std::chrono::milliseconds waited) const;
  // Later work on `stream` runs after this collective (no host block on
  // CUDA; a CPU stream's worker waits).
  void wait_on(Stream& stream) const { stream.wait(done_); }
  const Event& event() const { return done_; }

 private:
  [[noreturn]] void throw_timeout(std::chrono::milliseconds timeout) const;

  CollectiveInfo info_;
  Event done_;
  std::string communicator_name_;
  std::chrono::milliseconds default_timeout_;
  Diagnose diagnose_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace mp

// comm/mpi/staged_communicator.h: the Communicator for CUDA memory over MPI,
// staging every tensor through pinned host memory. For machines where NCCL
// cannot run, above all several ranks sharing one GPU (NCCL refuses two
// ranks of a communicator on one device), which is how multi-rank GPU tests
// run on a one-GPU machine. Semantics are those of comm/communicator.h and
// Note [What completion means] in comm/work.h; this header says how the
// staged backend keeps them.
//
// Note [Staged collectives]
// A collective on CUDA tensors is issued, in call order, as:
//   1. on stream() (a CudaStream of this communicator): copy the input
//      device -> pinned host staging buffer; record event `staged`;
//   2. on the inner MpiCommunicator's communication thread: a task that
//      polls `staged` until it completes, bounded by the timeout
//      (wait_until_staged, comm/mpi/staged_completion.h); then the same
//      collective with the same options on the host buffers, so the inner
//      backend decides every semantic (reduce_accumulate, average and
//      divide factor, in place, fingerprints, sequence numbers, timeouts);
//      then a task that runs even when the thread failed before it
//      (CpuStream::submit_always): it keeps the collective's failure and
//      raises this communicator's host word to the collective's number k
//      (finish_staged; 1, 2, ... in issue order);
//   3. on stream(): a wait, on the device, until the host word reaches k
//      (cuStreamWaitValue32: Note [Device waits on host words] in
//      core/cuda_host_word.h), so the stream goes no further until the
//      result is in host memory. No host thread blocks for it, CUDA's
//      callback thread least of all;
//   4. on stream(): copy the result host -> device; record the Work's event.
// Everything of one collective is enqueued at the call, so the order on
// stream() is the issue order: work a caller submits to stream() before a
// collective (a hook's cast) feeds it, work submitted after it sees its
// result, and Work::wait_on(compute stream) is a cudaStreamWaitEvent, never
// a host sync, as with NCCL. The Work's event completes when the result is
// on the device; its CollectiveInfo (op, sequence number) is the inner
// collective's. In-place calls stay in place on the host (the inner backend
// sees the same aliasing), so results are bitwise those of the MPI backend
// on the same data.
//
// Why no wait is for ever. The host's waits are bounded: Work::wait polls
// the Work's event (comm/work.h), step 2's wait polls `staged`, and the MPI
// call is the inner backend's, whose Work the peers' timeouts bound. The
// device's wait for k ends once the communication thread has finished
// collective k. That needs, from this process, `staged` of collectives up
// to k, which stream() reached before its wait for k, and from each peer
// its collective k, which needs the same there. Work on the device that
// feeds `staged` of k waits only for events recorded before collective k
// was issued, and CUDA, which may hold a stream behind another's wait when
// they share a hardware queue, holds work only behind waits submitted
// before it: waits for collectives before k. So, by induction over k, with
// the same issue order on every rank, collective k completes once the
// device work issued before it does; a rank that stops short of it shows
// up as a timeout naming it. "Before" must span every staged communicator
// of the process, hence:
//
// One communicator in flight. At most one staged communicator of a process
// has collectives in flight: before issuing on one, the caller waits (on
// the host, bounded by the timeout) for the last collective issued on any
// other. Collectives on different staged communicators must therefore be
// issued in the same relative order on every rank (as if they shared one
// stream), which a deterministic schedule does.
//
// Without device waits (HostWord::supported() false, or StagedWait::kHost
// at create()): step 3 is a wait of the issuing thread, bounded by the
// timeout, for the MPI part; the call returns after it, so the host runs
// ahead of the device only up to the next collective. Same results, less
// overlap.
//
// Failures. A failed MPI part cannot fail a CUDA stream: when the inner
// collective fails (an MPI error, a fingerprint mismatch), the word is
// raised all the same, the copy back still runs (the output is undefined),
// and the error is rethrown by the next call on this communicator
// (collective, barrier, fence, split or control-plane exchange). When
// `staged` does not complete within the timeout, the communication thread
// fails with a CommError naming the collective: this rank skips it and
// every later one, its peers' waits name it as missing, and the next call
// rethrows it. A Work that does not complete within its timeout names what
// the inner collective is waiting for (Note [Peer monitor]). A destructor
// after a timeout (streams abandoned) raises the word past every
// collective issued, so that no device work waits on it for ever, and
// keeps the stream, the word and the staging buffer (the process is about
// to end).
//
// Cost: two copies per collective (device -> host, host -> device) on top of
// the MPI collective, and no overlap between the copies and the transfer.
// Broadcast copies down on the root only and up on the others.
//
// Staging: one pinned buffer per communicator, holding the input and (when
// not in place) the output of a collective. It is allocated through the
// accounting Allocator (host memory, MemCategory::kCommScratch, memory())
// and pinned with cudaHostRegister (core/allocator.h has no pinned
// memory), at least 2 MiB and in multiples of it: such buffers get pages of
// their own, so pinning never touches a page another buffer shares. It
// grows to the largest collective seen, after waiting (bounded) for every
// staged collective of the process in flight (this communicator's read
// the old buffer; the others' are over by the rule above): so no device
// wait on a host word is pending while cudaHostUnregister and
// cudaHostRegister run, and any synchronisation they do waits only for
// work that ends by itself. create(..., staging_bytes) sizes it once up
// front so that it never grows in a step.
// The control plane (Note [Control plane]) is host memory already and goes
// straight to the inner communicator, in issue order with its collectives.
//
// Devices: device() is the CUDA device given to create(). Issuing makes it
// current on the calling thread for the call (and restores the previous
// one); the inner communication thread, which queries CUDA events, gets it
// once at construction (core/device.h set_current_device). A build without
// CUDA (MP_WITH_CUDA 0) compiles this file, and create() throws
// ConfigError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/allocator.h"

namespace mp {

class HostWord;
class FirstFailure;

// How stream() waits for a collective's MPI part (Note [Staged
// collectives], step 3).
enum class StagedWait {
  kAuto,    // on the device where it can (HostWord::supported), else the host
  kDevice,  // on the device; create() throws ConfigError where it cannot
  kHost,    // the issuing thread waits (bounded) before the copy back
};

class StagedMpiCommunicator final : public Communicator {
 public:
  // Wraps `inner` (owned; its name and options become this communicator's)
  // for tensors on `device`, a CUDA device. `staging_bytes` > 0 allocates the
  // staging buffer now (it still grows if a collective needs more). `wait`:
  // how stream() waits for the MPI parts (split() children inherit it).
  // Not collective. Throws ConfigError in a build without CUDA, for a
  // device that is not CUDA or not present (naming why CUDA is
  // unavailable) and for kDevice where the device cannot wait on host
  // words (naming why), and EnforceError without an inner communicator.
  static std::unique_ptr<StagedMpiCommunicator> create(std::unique_ptr<MpiCommunicator> inner, Device device,
                                                       size_t staging_bytes = 0, StagedWait wait = StagedWait::kAuto);

  // Waits for what was issued (at most the timeout; never throws).
  ~StagedMpiCommunicator() override;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Device device() const override { return device_; }
  Stream& stream() override { return *stream_; }

  // Completes when every rank's stream() has reached it (as NCCL's barrier).
  WorkPtr barrier() override;
  WorkPtr fence(const std::string& what) override;
  // The inner communicator's split (collective), staged on the same device.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

  // Host bytes of the staging buffer (comm_scratch category).
  MemStats memory() const { return allocator_.stats(); }
  // Whether stream() waits for the MPI parts on the device (else the
  // issuing thread waits).
  bool device_waits() const { return word_ != nullptr; }

 protected:
  WorkPtr do_all_gather(const Tensor& input, const Tensor& output, bool in_place) override;
  WorkPtr do_reduce_scatter(const Tensor& input, const Tensor& output, const ReduceOptions& options,
                            bool in_place) override;
  WorkPtr do_all_reduce(const Tensor& input, const Tensor& output, const ReduceOptions& options,
                        bool in_place) override;
  WorkPtr do_broadcast(const Tensor& tensor, int root) override;
  WorkPtr do_all_to_all(const Tensor& input, const Tensor& output, bool in_place) override;
  WorkPtr do_all_to_all_v(const Tensor& input, const std::vector<int64_t>& send_counts, const Tensor& output,
                          const std::vector<int64_t>& recv_counts) override;
  // Straight to the inner communicator (host memory), in issue order.
  void do_host_all_gather(const void* mine, size_t bytes, void* all) override;

 private:
  StagedMpiCommunicator(std::unique_ptr<MpiCommunicator> inner, Device device, StagedWait wait);

  // One device <-> host copy of a staged collective.
  struct Copy {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  // A collective's part of Note [Staged collectives]: `down` copies before
  // the inner collective that `run_inner` issues, `up` copies after it.
  struct Plan {
    std::vector<Copy> down;
    std::function<WorkPtr()> run_inner;
    std::vector<Copy> up;
  };

  // Steps 1-4 of Note [Staged collectives] for the collective `op`, whose
  // staging needs `staging_bytes`; `plan` lays it out on the staging
  // buffer (its start given).
  WorkPtr stage(const char* op, size_t staging_bytes, const std::function<Plan(char*)>& plan);
  // stage() of a collective from `input` to `output`: copies input down,
  // `run` on their host views, copies output up.
  WorkPtr stage_pair(const char* op, const Tensor& input, const Tensor& output, bool in_place,
                     const std::function<WorkPtr(const Tensor&, const Tensor&)>& run, bool output_whole = false);
  // Rethrows the first failure of a collective's MPI part.
  void rethrow_failure() const;
  // Makes the staging buffer hold at least `bytes`; returns its start.
  char* staging(size_t bytes);
  void unpin_staging() noexcept;
  // Host tensor of n elements over the staging buffer at byte `offset`.
  Tensor host_view(char* base, size_t offset, DType dtype, int64_t n) const;
  // Waits for every collective issued here (bounded by the timeout).
  void drain();

  std::unique_ptr<MpiCommunicator> inner_;
  CpuStream* inner_thread_ = nullptr;  // inner_'s communication thread
  Device device_;
  StagedWait wait_;
  Allocator allocator_;                    // host memory: the staging buffer's accounting
  Buffer staging_;                         // pinned while held (cudaHostRegister)
  std::shared_ptr<FirstFailure> failure_;  // shared with the communication thread's tasks
  std::shared_ptr<HostWord> word_;         // step 3's word; null when the host waits
  [[maybe_unused]] uint32_t issued_ = 0;   // collectives staged so far: the last one's number (CUDA builds)
  WorkPtr last_work_;                      // the last collective issued here
  WorkPtr last_inner_;                     // its inner collective (a fence's diagnosis)
  std::unique_ptr<Stream> stream_;         // a CudaStream on device_
};

}  // namespace mp

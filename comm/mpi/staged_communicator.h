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
//   2. on the inner MpiCommunicator: its stream waits for `staged` (its
//      communication thread, which has the device made current, blocks in
//      cudaEventSynchronize), then the same collective with the same options
//      on the host buffers. The inner backend therefore decides every
//      semantic (reduce_accumulate, average and divide factor, in place,
//      fingerprints, sequence numbers, timeouts);
//   3. on stream(): a host function (cudaLaunchHostFunc) that returns once
//      the inner collective has completed, so that the stream goes no
//      further until the result is in host memory;
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
// Host functions. CUDA may run the host functions of all streams of a
// process on one thread, one at a time; a host function that waits for a
// collective of communicator A could then hold up B's, and two ranks doing
// this in opposite orders would wait for each other. So at most one staged
// communicator of a process has collectives in flight: before issuing on
// one, the caller waits (on the host, bounded by the timeout) for the last
// collective issued on any other. Collectives on different staged
// communicators must therefore be issued in the same relative order on every
// rank (as if they shared one stream), which a deterministic schedule does.
//
// Failures. A host function cannot fail a CUDA stream: when the inner
// collective fails (an MPI error, a fingerprint mismatch, its timeout), the
// copy back still runs (the output is undefined), and the error is rethrown
// by the next call on this communicator (collective, barrier, fence, split
// or control-plane exchange). A Work that does not complete within its
// timeout names what the inner collective is waiting for (Note [Peer
// monitor]).
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
// grows to the largest collective seen, after waiting for this
// communicator's collectives in flight (they read it); create(...,
// staging_bytes) sizes it once up front so that it never grows in a step.
// The control plane (Note [Control plane]) is host memory already and goes
// straight to the inner communicator, in issue order with its collectives.
//
// Devices: device() is the CUDA device given to create(). Issuing makes it
// current on the calling thread for the call (and restores the previous
// one); the inner communication thread, which waits for CUDA events, gets
// it once at construction (core/device.h set_current_device). A build
// without CUDA (MP_WITH_CUDA 0) compiles this file, and create() throws
// ConfigError.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/allocator.h"

namespace mp {

class StagedMpiCommunicator final : public Communicator {
 public:
  // Wraps `inner` (owned; its name and options become this communicator's)
  // for tensors on `device`, a CUDA device. `staging_bytes` > 0 allocates the
  // staging buffer now (it still grows if a collective needs more). Not
  // collective. Throws ConfigError in a build without CUDA, for a device that
  // is not CUDA or not present (naming why CUDA is unavailable), and
  // EnforceError without an inner communicator.
  static std::unique_ptr<StagedMpiCommunicator> create(std::unique_ptr<MpiCommunicator> inner, Device device,
                                                       size_t staging_bytes = 0);

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

 protected:
  WorkPtr do_all_gather(const Tensor& input, const Tensor& output, bool in_place) override;
  WorkPtr do_reduce_scatter(const Tensor& input, const Tensor& output, const ReduceOptions& options,
                            bool in_place) override;
  WorkPtr do_all_reduce(const Tensor& input, const Tensor& output, const ReduceOptions& options,
                        bool in_place) override;
  WorkPtr do_broadcast(const Tensor& tensor, int root) override;
  WorkPtr do_all_to_all(const Tensor& input, const Tensor& output, bool in_place) override;
  // Straight to the inner communicator (host memory), in issue order.
  void do_host_all_gather(const void* mine, size_t bytes, void* all) override;

 private:
  StagedMpiCommunicator(std::unique_ptr<MpiCommunicator> inner, Device device);

  struct State;     // shared with the host functions in flight
  struct HostPart;  // the argument of one host function
  // One device <-> host copy of a staged collective.
  struct Copy {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  };

  // Steps 1-4 of Note [Staged collectives]: `down` copies before the inner
  // collective that `run_inner` issues, `up` copies after it.
  WorkPtr stage(const std::vector<Copy>& down, const std::function<WorkPtr()>& run_inner,
                const std::vector<Copy>& up);
  // Step 3's host function: waits for the inner collective (no CUDA calls).
  static void finish_host_part(void* part) noexcept;
  // Rethrows the first failure of a collective's host part.
  void rethrow_failure() const;
  // Makes the staging buffer hold at least `bytes`; returns its start.
  char* staging(size_t bytes);
  void unpin_staging() noexcept;
  // Host tensor of n elements over the staging buffer at byte `offset`.
  Tensor host_view(char* base, size_t offset, DType dtype, int64_t n) const;
  // Waits for every collective issued here (bounded by the timeout).
  void drain();

  std::unique_ptr<MpiCommunicator> inner_;
  Device device_;
  Allocator allocator_;             // host memory: the staging buffer's accounting
  Buffer staging_;                  // pinned while held (cudaHostRegister)
  std::shared_ptr<State> state_;
  WorkPtr last_work_;               // the last collective issued here
  WorkPtr last_inner_;              // its inner collective (a fence's diagnosis)
  std::unique_ptr<Stream> stream_;  // a CudaStream on device_
};

}  // namespace mp

// comm/nccl/nccl_communicator.h: the Communicator for CUDA memory over NCCL.
// Only in builds with MP_WITH_NCCL. Semantics are those of
// comm/communicator.h and Note [What completion means] in comm/work.h; this
// header says how the NCCL backend keeps them.
//
// Start-up and device
// - create() is collective over `host`, a communicator in CPU memory over
//   the same ranks (MpiCommunicator under mpirun, GlooCommunicator under
//   torchrun), which it keeps as its control plane: the unique id, the
//   host values, fingerprints and splits go over it, and its peer monitor
//   names the ranks behind (Communicator::watch). Rank 0 calls
//   ncclGetUniqueId and broadcasts it over `host`; every rank then calls
//   ncclCommInitRankConfig with a non-blocking config (blocking = 0) and
//   polls ncclCommGetAsyncError until the communicator is ready, at most
//   CommOptions::timeout; on timeout or error it calls ncclCommAbort and
//   throws CommError.
// - The device is the caller's choice: cuda(local rank % devices), the
//   local rank from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) under mpirun
//   (launch/device_choice.h, comm/mpi/mpi_world.h), LOCAL_RANK under
//   torchrun (python/src/engine.cc). Two ranks of one communicator must not
//   share a device: NCCL rejects that (compute.share_gpus takes the staged
//   MPI backend instead).
//
// Issue and completion
// - Every collective is enqueued on the communicator's own CudaStream
//   (stream()), with its post-processing (average, divide factor, fp32
//   accumulation), and returns a Work whose event is recorded on that stream
//   after all of it. Because the communicator is non-blocking, an NCCL call
//   may return ncclInProgress before its kernels are on the stream; issue
//   then polls ncclCommGetAsyncError until they are (bounded by the timeout)
//   before anything else is enqueued or recorded, so the order on the stream
//   is the issue order.
// - The caller's compute stream is not waited for: the input must be ready
//   when stream() reaches the collective (Work::wait_on / Stream::wait from
//   the producer's stream first), and must stay alive until the Work
//   completes. Errors found on the host while issuing (bad arguments, NCCL
//   call failures, a mismatch under check_fingerprints) throw from the call.
// - One host thread issues at a time (as with every Communicator). Work::wait
//   and the diagnosis may run on any thread.
//
// Data types: fp32 ncclFloat32, bf16 ncclBfloat16, fp16 ncclFloat16 for
// everything. fp8 (reductions refused with ConfigError) moves as ncclUint8 in
// all_gather, broadcast and all_to_all: the same bits, and NCCL refuses its
// ncclFloat8e4m3/e5m2 below sm_90 in some versions, while we build for sm_80.
//
// Reductions
// - sum and avg: ncclSum in the wire dtype (kWire), then our division
//   (convert() with ConvertOptions::divisor: fp64, rounded once) on the
//   stream. Never ncclAvg or ncclPreMulSum: the contract says the factor is
//   applied by us.
// - max and min: not ncclMax/ncclMin, which use fmaxf/fminf and drop NaN
//   (NCCL src/device/reduce_kernel.h); the contract says they propagate it.
//   They take the accumulation path below with math::ElementOp kMax/kMin,
//   which is exact (a max is representable), NaN-propagating and
//   deterministic.
// - reduce_accumulate kFp32 (Note [Reduce accumulation]): rounds of grouped
//   ncclSend/ncclRecv move at most CommOptions::accumulate_chunk_bytes of
//   wire-dtype chunks into one scratch buffer, then
//   accumulate_rank_chunks_cuda sums them in fp64 in rank order. all_reduce
//   then all-gathers the reduced chunks of ceil(n / size) elements: with
//   ncclAllGather in place when size divides n, otherwise with grouped
//   send/recv of the unequal chunks straight into the output. Neither needs
//   memory beyond the one scratch buffer.
// - all_to_all: grouped ncclSend/ncclRecv; in place it stages bounded
//   pieces of the input through the same scratch buffer.
// - barrier: an ncclAllReduce of one int32 on a 4-byte device buffer
//   allocated once; its Work completes when every rank has reached it.
// Scratch is allocated once, on first use, through this communicator's
// Allocator on the device (MemCategory::kCommScratch): memory().
//
// Watchdog, timeouts and abort
// - Before each collective the communicator checks ncclCommGetAsyncError;
//   an asynchronous error aborts it (ncclCommAbort) and throws CommError.
// - Work::wait(timeout) polls the collective's CUDA event. On timeout its
//   Diagnose callback reports this rank's sequence numbers (issued by the
//   host, enqueued on the stream, completed by the GPU), the NCCL async
//   state and ncclGetLastError, and which ranks have not issued the
//   collective (the host communicator's peer monitor). Then it aborts the
//   NCCL communicator with ncclCommAbort, so the stuck kernels end, BEFORE
//   Work::wait throws its CommError. The
//   communicator is unusable afterwards: every later call throws CommError.
//   So a short wait(timeout) used as a poll ends the communicator: poll with
//   Work::is_completed() instead. Work::wait polls only the CUDA event, so
//   an asynchronous NCCL error during a wait (a peer died) shows when the
//   timeout passes, in the diagnosis; the next issue reports it at once.
// - A Work whose collective was aborted may later report completion (the
//   aborted kernels end); its output is undefined, and the CommError of the
//   wait that timed out, or of the next call, is the record of the failure.
// - The destructor waits (at most the timeout) for the stream, then
//   ncclCommFinalize + ncclCommDestroy; if the stream does not drain, or the
//   finalize does not complete within the timeout, it aborts instead. It
//   never throws. Destroy a communicator on all members at about the same
//   time: finalizing may wait for the peers.
//
// Splits: split() splits the host communicator, then a fresh create() (new
// unique id, ncclCommInitRankConfig) on the members over the child host
// communicator, not ncclCommSplit. The child needs its own host communicator
// anyway (for its own splits and fingerprints); a fresh init does not depend
// on the parent's NCCL state (in-flight work, an abort) and does not tie the
// child's resources to the parent. It costs a full NCCL init (topology
// detection, no shared buffers), which is acceptable for the few splits made
// at start-up (HYBRID_SHARD groups).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/chunked_reduction.h"
#include "comm/communicator.h"
#include "core/allocator.h"
#include "core/cuda_stream.h"
#include "kernels/reduce_math.h"

namespace mp {

class NcclState;  // comm/nccl/nccl_state.h

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `host`, which it keeps (see the header comment). Throws
  // CommError when the NCCL communicator cannot be created within
  // options.timeout.
  static std::unique_ptr<NcclCommunicator> create(std::unique_ptr<Communicator> host, Device device,
                                                  const std::string& name, CommOptions options);

  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return device_; }
  Stream& stream() override { return stream_; }

  WorkPtr barrier() override;
  WorkPtr fence(const std::string& what) override;
  // A child over the members of `color`, ordered by (key, rank); nullptr for
  // a negative color. Collective over this communicator.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

  // Device bytes of scratch held (comm_scratch category). NCCL's own
  // buffers are not counted here.
  MemStats memory() const { return allocator_.stats(); }

  // Aborts the NCCL communicator (ncclCommAbort): kernels in flight end and
  // their outputs are undefined; every later collective throws CommError.
  void abort_communicator(const std::string& reason);
  bool aborted() const;

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
  // Host values over the host communicator (Note [Control plane] in
  // comm/communicator.h), numbered in this communicator's sequence.
  void do_host_all_gather(const void* mine, size_t bytes, void* all) override;

 private:
  NcclCommunicator(std::unique_ptr<Communicator> host, Device device, std::string name, CommOptions options);
  void init_nccl();
  // Refuses an aborted communicator, numbers `info` and checks its fingerprint.
  void number(CollectiveInfo& info);
  // `exchange` over the host communicator; if it throws (its timeout names
  // the ranks behind), this rank is out of step: the NCCL communicator is
  // aborted first.
  template <class F>
  auto on_host(const CollectiveInfo& info, F&& exchange);

  // Issues collective `info`: assigns its sequence number, checks the
  // fingerprint and the async state, runs `enqueue` (NCCL calls and
  // kernels on the stream), waits until NCCL has enqueued, records the event.
  WorkPtr issue(CollectiveInfo info, const std::function<void()>& enqueue);
  void check_fingerprint(const CollectiveInfo& info);
  Work::Diagnose diagnoser() const;

  // Makes the scratch buffer exist; returns its capacity in bytes.
  size_t ensure_scratch();
  // Note [Chunked reduction] (comm/chunked_reduction.h) over NCCL: rank r
  // reduces chunk r of every rank's input into out (fp64, rank order).
  void accumulate_chunks(const Tensor& input, const comm_detail::ChunkSplit& split, const Tensor& out,
                         math::ElementOp op, double divisor);
  // Every rank's chunk r of output from rank r, in place.
  void gather_chunks(const Tensor& output, const comm_detail::ChunkSplit& split);
  // Chunks of the counts' sizes, back to back: this rank's own copied,
  // every other one sent and received (all_to_all_v; all_to_all not in place).
  void send_chunks(const Tensor& input, const std::vector<int64_t>& send_counts, const Tensor& output,
                   const std::vector<int64_t>& recv_counts);
  void all_to_all_in_place(const Tensor& tensor, int64_t n);
  void post_divide(const Tensor& output, double divisor);

  std::unique_ptr<Communicator> host_;  // the control plane
  Device device_;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<NcclState> state_;  // the ncclComm_t; shared with the Works' diagnosis
  Allocator allocator_;
  Buffer scratch_;  // kFp32 accumulation / all_to_all staging, allocated once
  Buffer barrier_buffer_;  // one int32
  CudaStream stream_;
};

}  // namespace mp

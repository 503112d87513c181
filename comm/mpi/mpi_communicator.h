// comm/mpi/mpi_communicator.h: the Communicator for CPU memory over MPI.
// Collectives run in issue order on the communicator's own communication
// thread (a CpuStream), so the caller's thread computes while they run.
// That thread waits on a failed event as on a completed one
// (StreamOptions::inherits_failures false): a collective whose input the
// caller's failed work never wrote still runs, as NCCL's would, so the
// peers are never left waiting; the caller reports its own failure.
// MPI must be initialized with MPI_THREAD_MULTIPLE (comm/mpi/mpi_world.h).
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "comm/chunked_reduction.h"
#include "comm/communicator.h"
#include "comm/mpi/mpi_context.h"
#include "core/allocator.h"
#include "kernels/reduce_math.h"

namespace mp {

class MpiCommunicator final : public Communicator {
 public:
  // Collective over MPI_COMM_WORLD: a communicator over all ranks, with a
  // new context (the peer monitor) that its splits share.
  static std::unique_ptr<MpiCommunicator> create_world(const std::string& name, CommOptions options);

  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu(); }
  Stream& stream() override { return stream_; }

  WorkPtr barrier() override;
  WorkPtr fence(const std::string& what) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

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
  // On the communication thread, in issue order, as collective
  // "host_all_gather" (waited for here).
  void do_host_all_gather(const void* mine, size_t bytes, void* all) override;

 private:
  MpiCommunicator(std::shared_ptr<MpiContext> ctx, MPI_Comm comm, uint64_t id, std::string name,
                  CommOptions options);

  // Issues `body` on the communication thread as collective `info`.
  WorkPtr issue(CollectiveInfo info, std::function<void()> body);
  void check_fingerprint(const CollectiveInfo& info);
  Work::Diagnose diagnoser() const;

  // Note [Chunked reduction] (comm/chunked_reduction.h) over MPI: rank r
  // reduces chunk r of every rank's input into out, in rank order: in
  // fp64, divided by `divisor` and rounded once (kFp32), or with `wire`, in
  // the wire dtype (kWire: reduce_pair_element at every step; out has the
  // input's dtype and `divisor` must be 1).
  void accumulate_chunks(const Tensor& input, const comm_detail::ChunkSplit& split, const Tensor& out,
                         math::ElementOp op, double divisor, bool wire = false);
  // Every rank's chunk of output, passed around the ring of ranks (Note
  // [Ring all-gather] in mpi_communicator.cc); this rank's chunk comes from
  // `mine` (in place when it is output's own chunk).
  void gather_ring(const void* mine, const Tensor& output, const comm_detail::ChunkSplit& split);

  std::shared_ptr<MpiContext> ctx_;
  MPI_Comm comm_;  // owned; used only on the communication thread after construction
  uint64_t id_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;  // member -> MPI_COMM_WORLD rank
  std::shared_ptr<CommProgress> progress_;
  uint64_t splits_ = 0;
  Allocator allocator_;
  Tensor scratch_;  // kFp32 accumulation chunks, allocated on first use
  CpuStream stream_;  // last: its thread stops first
};

}  // namespace mp

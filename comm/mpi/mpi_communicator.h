// comm/mpi/mpi_communicator.h: the Communicator for CPU memory over MPI.
// Collectives run in issue order on the communicator's own communication
// thread (comm/host_communicator.h), so the caller's thread computes while
// they run. That thread waits on a failed event as on a completed one
// (StreamOptions::inherits_failures false): a collective whose input the
// caller's failed work never wrote still runs, as NCCL's would, so the
// peers are never left waiting; the caller reports its own failure.
// MPI must be initialized with MPI_THREAD_MULTIPLE (comm/mpi/mpi_world.h).
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "comm/host_communicator.h"
#include "comm/mpi/mpi_context.h"

namespace mp {

class MpiCommunicator final : public HostCommunicator {
 public:
  // Collective over MPI_COMM_WORLD: a communicator over all ranks, with a
  // new context (the peer monitor) that its splits share.
  static std::unique_ptr<MpiCommunicator> create_world(const std::string& name, CommOptions options);

  ~MpiCommunicator() override;

  WorkPtr barrier() override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 protected:
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

  void gather_fingerprints(const CollectiveInfo& info, const std::array<int64_t, 4>& mine,
                           std::vector<int64_t>& all) override;
  // Note [Chunked reduction] (comm/chunked_reduction.h) over MPI (kWire:
  // reduce_pair_element at every step).
  void accumulate_chunks(const CollectiveInfo& info, const Tensor& input, const comm_detail::ChunkSplit& split,
                         const Tensor& out, math::ElementOp op, double divisor, bool wire) override;
  // Note [Ring all-gather] in mpi_communicator.cc.
  void gather_ring(const CollectiveInfo& info, const void* mine, const Tensor& output,
                   const comm_detail::ChunkSplit& split) override;

  std::shared_ptr<MpiContext> ctx_;
  MPI_Comm comm_;  // owned; used only on the communication thread after construction
};

}  // namespace mp

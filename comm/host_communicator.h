// comm/host_communicator.h: what the Communicators for CPU memory (MPI,
// Gloo) share: collectives in issue order on a communication thread of the
// communicator's own (a CpuStream that waits on a failed event as on a
// completed one: the peers are never left waiting), their sequence numbers
// and fingerprints, and the reduce-scatter, all-reduce and all-gather
// written once over a backend's two transport pieces: Note [Chunked
// reduction] (comm/host_rounds.h) and Note [Ring all-gather]
// (comm/mpi/mpi_communicator.cc). Internal to comm/.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/chunked_reduction.h"
#include "comm/communicator.h"
#include "comm/peer_report.h"
#include "core/allocator.h"
#include "kernels/reduce_math.h"

namespace mp {

class HostCommunicator : public Communicator {
 public:
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu(); }
  Stream& stream() override { return stream_; }
  WorkPtr fence(const std::string& what) override;
  // Under an id of a lineage that no split's child has (their colors are >= 0).
  Work::Diagnose watch(std::shared_ptr<CommProgress> progress) override;

 protected:
  HostCommunicator(std::string name, CommOptions options, uint64_t id, std::shared_ptr<PeerMonitor> monitor);

  WorkPtr do_all_gather(const Tensor& input, const Tensor& output, bool in_place) override;
  WorkPtr do_reduce_scatter(const Tensor& input, const Tensor& output, const ReduceOptions& options,
                            bool in_place) override;
  WorkPtr do_all_reduce(const Tensor& input, const Tensor& output, const ReduceOptions& options,
                        bool in_place) override;

  // Issues `body` on the communication thread as collective `info`, after
  // the fingerprint check (CommOptions::check_fingerprints).
  WorkPtr issue(CollectiveInfo info, std::function<void(const CollectiveInfo&)> body);
  // The id of the child of this communicator's next split with `color`.
  uint64_t child_id(int color);
  // Who timed out: the peer monitor's answer.
  Work::Diagnose diagnoser() const;

  // The backend's pieces, on the communication thread.
  // Every rank's fingerprint (4 words each, in rank order) into `all`.
  virtual void gather_fingerprints(const CollectiveInfo& info, const std::array<int64_t, 4>& mine,
                                   std::vector<int64_t>& all) = 0;
  // Every rank's chunk of output, passed around the ring of ranks; this
  // rank's chunk comes from `mine` (in place when it is output's own chunk).
  virtual void gather_ring(const CollectiveInfo& info, const void* mine, const Tensor& output,
                           const comm_detail::ChunkSplit& split) = 0;
  // Rank r reduces chunk r of every rank's input into out, in rank order:
  // in fp64, divided by `divisor` and rounded once, or with `wire`, in the
  // wire dtype (out has the input's dtype and `divisor` is 1).
  virtual void accumulate_chunks(const CollectiveInfo& info, const Tensor& input,
                                 const comm_detail::ChunkSplit& split, const Tensor& out, math::ElementOp op,
                                 double divisor, bool wire) = 0;

  uint64_t id_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> members_;  // member -> world rank
  std::shared_ptr<PeerMonitor> monitor_;
  std::shared_ptr<CommProgress> progress_;
  uint64_t splits_ = 0;
  Allocator allocator_;
  Tensor scratch_;  // accumulation chunks, allocated on first use
  // Last: its thread stops first. A backend's destructor waits for it
  // (unless streams were abandoned) before its own members go.
  CpuStream stream_;
};

}  // namespace mp

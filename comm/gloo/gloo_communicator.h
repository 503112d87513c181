// comm/gloo/gloo_communicator.h: the Communicator for CPU memory over Gloo's
// TCP transport, for ranks that no MPI launcher started (torchrun, srun
// without MPI): they meet through a key-value store (comm/store.h).
//
// Note [Gloo backend]
// Only Gloo's transport is used: point-to-point transfers between this
// process's pairs (unbound buffers, each collective on slots of its own),
// never Gloo's collective algorithms, so the reductions are mp's own and
// give the MPI backend's bits: reduce_scatter and all_reduce are Note
// [Chunked reduction] (comm/host_rounds.h, two rounds in flight), the
// all-gathers Note [Ring all-gather] (comm/mpi/mpi_communicator.cc), the
// all-to-alls one round of every pair's transfers, broadcast the root to each
// rank. As MpiCommunicator: collectives run in issue order on a
// communication thread of the communicator's own; fingerprints, sequence
// numbers and Work's timeout are the same; a timed-out wait names the ranks
// behind through Note [Gloo peer monitor] (comm/gloo/gloo_context.h). A
// peer whose connection closes (its process died) fails the collective at
// once with a CommError naming it. Gloo's own waits are bounded by four
// times the timeout plus the diagnosis plus 10 s, so Work::wait reports first
// and a straggler may still complete what others gave up waiting for.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/chunked_reduction.h"
#include "comm/communicator.h"
#include "comm/gloo/gloo_context.h"
#include "core/allocator.h"
#include "kernels/reduce_math.h"

namespace mp {

struct GlooSameHost;

class GlooCommunicator final : public Communicator {
 public:
  // Collective over the ranks meeting in `store` (rank `rank` of `size`),
  // each reachable at `host` (comm/gloo/gloo_context.h): a communicator over
  // all of them, with a new context (device, hosts, peer monitor) that its
  // splits share.
  static std::unique_ptr<GlooCommunicator> create_world(std::shared_ptr<KeyValueStore> store, int rank, int size,
                                                        const std::string& host, const std::string& name,
                                                        CommOptions options);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu(); }
  Stream& stream() override { return stream_; }

  WorkPtr barrier() override;
  WorkPtr fence(const std::string& what) override;
  // Collective: a host all-gather of the colors and keys, then each new
  // group connects through the store.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    return split(color, key, name, options());
  }
  // With options of its own (an engine's timeout).
  std::unique_ptr<GlooCommunicator> split(int color, int key, const std::string& name, const CommOptions& options);

  // Note [Same-host transfers]: the members this rank messages over a
  // same-host channel rather than Gloo.
  int same_host_channels() const;

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
  void do_host_all_gather(const void* mine, size_t bytes, void* all) override;

 private:
  GlooCommunicator(std::shared_ptr<GlooContext> ctx, std::shared_ptr<gloo::transport::Context> gloo,
                   std::vector<int> members, std::vector<int> channels, uint64_t id, std::string name,
                   CommOptions options);

  WorkPtr issue(CollectiveInfo info, std::function<void(const CollectiveInfo&)> body);
  Work::Diagnose diagnoser() const;
  // On the communication thread: the exchange primitives of one collective.
  void gather_ring(const CollectiveInfo& info, const void* mine, const Tensor& output,
                   const comm_detail::ChunkSplit& split);
  void accumulate_chunks(const CollectiveInfo& info, const Tensor& input, const comm_detail::ChunkSplit& split,
                         const Tensor& out, math::ElementOp op, double divisor, bool wire);
  void host_gather(const CollectiveInfo& info, const void* mine, size_t bytes, void* all, uint64_t round = 0);
  // Every rank's chunks to every rank (all_to_all, all_to_all_v).
  WorkPtr exchange_all(CollectiveInfo what, const Tensor& input, const std::vector<int64_t>& send_counts,
                       const Tensor& output, const std::vector<int64_t>& recv_counts);

  std::shared_ptr<GlooContext> ctx_;
  std::shared_ptr<gloo::transport::Context> gloo_;
  std::vector<int> members_;  // member -> world rank
  uint64_t id_;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<CommProgress> progress_;
  std::shared_ptr<GlooSameHost> same_host_;
  uint64_t splits_ = 0;
  Allocator allocator_;
  Tensor scratch_;
  CpuStream stream_;  // last: its thread stops first
};

}  // namespace mp

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

#include "comm/gloo/gloo_context.h"
#include "comm/host_communicator.h"

namespace mp {

struct GlooSameHost;

class GlooCommunicator final : public HostCommunicator {
 public:
  // Collective over the ranks meeting in `store` (rank `rank` of `size`),
  // each reachable at `host` (comm/gloo/gloo_context.h): a communicator over
  // all of them, with a new context (device, hosts, peer monitor) that its
  // splits share.
  static std::unique_ptr<GlooCommunicator> create_world(std::shared_ptr<KeyValueStore> store, int rank, int size,
                                                        const std::string& host, const std::string& name,
                                                        CommOptions options);
  ~GlooCommunicator() override;

  WorkPtr barrier() override;
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
  WorkPtr do_broadcast(const Tensor& tensor, int root) override;
  WorkPtr do_all_to_all(const Tensor& input, const Tensor& output, bool in_place) override;
  WorkPtr do_all_to_all_v(const Tensor& input, const std::vector<int64_t>& send_counts, const Tensor& output,
                          const std::vector<int64_t>& recv_counts) override;
  void do_host_all_gather(const void* mine, size_t bytes, void* all) override;

 private:
  GlooCommunicator(std::shared_ptr<GlooContext> ctx, std::shared_ptr<gloo::transport::Context> gloo,
                   std::vector<int> members, std::vector<int> channels, uint64_t id, std::string name,
                   CommOptions options);

  void gather_fingerprints(const CollectiveInfo& info, const std::array<int64_t, 4>& mine,
                           std::vector<int64_t>& all) override;
  // On the communication thread: the exchange primitives of one collective.
  void gather_ring(const CollectiveInfo& info, const void* mine, const Tensor& output,
                   const comm_detail::ChunkSplit& split) override;
  void accumulate_chunks(const CollectiveInfo& info, const Tensor& input, const comm_detail::ChunkSplit& split,
                         const Tensor& out, math::ElementOp op, double divisor, bool wire) override;
  void host_gather(const CollectiveInfo& info, const void* mine, size_t bytes, void* all, uint64_t round = 0);
  // Every rank's chunks to every rank (all_to_all, all_to_all_v).
  WorkPtr exchange_all(CollectiveInfo what, const Tensor& input, const std::vector<int64_t>& send_counts,
                       const Tensor& output, const std::vector<int64_t>& recv_counts);

  std::shared_ptr<GlooContext> ctx_;
  std::shared_ptr<gloo::transport::Context> gloo_;
  std::shared_ptr<GlooSameHost> same_host_;
};

}  // namespace mp

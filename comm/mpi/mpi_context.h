// comm/mpi/mpi_context.h: what all MPI communicators of a job share: the
// peer monitor, a side channel that tells a timed-out rank where every other rank is.
//
// Note [Peer monitor]
// Each communicator publishes, per communicator id, the sequence number of
// the last collective its host issued and the last one its communication
// thread started. A responder thread per process answers queries for these
// on a private duplicate of MPI_COMM_WORLD. It answers even while the
// process's main thread computes and its communication thread is blocked
// inside a collective. A rank whose wait() times out asks every member.
// Members behind the sequence number "did not arrive"; members that do not
// answer within the diagnosis timeout are dead or stuck outside MPI.
// Communicator ids are derived from lineage (hash of the parent id, the
// parent's split count and the color), so they agree on every member.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/peer_report.h"
#include "kernels/reduce_math.h"  // for comm/nccl, which reads math::ElementOp through this header

namespace mp {

// Every rank's processor name (its host), in rank order. Collective over
// `comm`.
std::vector<std::string> gather_processor_names(MPI_Comm comm);

class MpiContext final : public PeerMonitor {
 public:
  // Collective over MPI_COMM_WORLD (duplicates it for the side channel).
  MpiContext();
  ~MpiContext() override;
  MpiContext(const MpiContext&) = delete;
  MpiContext& operator=(const MpiContext&) = delete;

  std::string diagnose(uint64_t id, uint64_t sequence, const std::vector<int>& members,
                       std::chrono::milliseconds reply_timeout) override;

 private:
  void respond_loop();
  const std::string& host_of(int world_rank) const { return hosts_.at(static_cast<size_t>(world_rank)); }

  int world_rank_ = 0;
  std::vector<std::string> hosts_;  // of every world rank (MPI_Get_processor_name)
  MPI_Comm side_ = MPI_COMM_NULL;

  std::mutex diagnose_mu_;  // one diagnosis at a time per process
  uint64_t nonce_ = 0;
  std::atomic<bool> stop_{false};
  std::thread responder_;
};

}  // namespace mp

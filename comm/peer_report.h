// comm/peer_report.h: the text of Note [Peer monitor] (comm/mpi/mpi_context.h)
// once the answers are in, whichever transport asked. Internal to comm/.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace mp {

// Progress of one communicator on this rank, read by the peer monitor's
// responder thread.
struct CommProgress {
  std::atomic<uint64_t> issued{0};   // last sequence number issued by the host
  std::atomic<uint64_t> started{0};  // last sequence number its comm thread started
};

}  // namespace mp

namespace mp::comm_detail {

// What one other member of the communicator said about it.
struct PeerAnswer {
  int member = 0;         // rank in the communicator
  std::string host;
  bool answered = false;  // within the diagnosis timeout
  bool known = false;     // it has this communicator
  uint64_t issued = 0;    // the last collective its host issued
  uint64_t started = 0;   // the last one its communication thread started
};

// "Not arrived: rank 2 (has issued up to #0). No answer within 2000 ms
// (dead, or stuck outside MPI): rank 3 on node1. Host node1 unreachable: ..."
// for the collective numbered `sequence`, asked from host `here`; `transport`
// names what a silent rank may be stuck outside of ("MPI", "Gloo").
std::string describe_peers(const std::vector<PeerAnswer>& peers, uint64_t sequence, const std::string& here,
                           std::chrono::milliseconds reply_timeout, const char* transport);

}  // namespace mp::comm_detail

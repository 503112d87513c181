// comm/peer_report.h: Note [Peer monitor] (comm/mpi/mpi_context.h), whichever
// transport asks: the progress it answers with, and its text once the
// answers are in. Internal to comm/.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mp {

// Progress of one communicator on this rank, read by the peer monitor's
// responder thread.
struct CommProgress {
  std::atomic<uint64_t> issued{0};   // last sequence number issued by the host
  std::atomic<uint64_t> started{0};  // last sequence number its comm thread started
};

// What every transport's peer monitor keeps: this process's communicators'
// progress by id, which its responder answers with, and the question to the
// other members (the transport's).
class PeerMonitor {
 public:
  virtual ~PeerMonitor() = default;

  void register_comm(uint64_t id, std::shared_ptr<CommProgress> progress);
  void unregister_comm(uint64_t id);
  // Asks each world rank in `members` (except this one) for its progress on
  // communicator `id`, and describes those not at `sequence` yet, each with
  // its host; a host none of whose ranks answered is named unreachable.
  virtual std::string diagnose(uint64_t id, uint64_t sequence, const std::vector<int>& members,
                               std::chrono::milliseconds reply_timeout) = 0;

 protected:
  // A reply's words {known (0/1), issued, started} for communicator `id`;
  // untouched (the caller's zeros) for an id this process does not have.
  void progress_of(uint64_t id, uint64_t* words);

 private:
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<CommProgress>> comms_;
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

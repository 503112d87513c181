// comm/mpi/link_check.h: how fast the links between a job's hosts are, measured
// once at startup, and which host is slow.
//
// Note [Link check]
// The ranks are grouped by host (MPI_Get_processor_name); each host's lowest
// rank is its leader. Every pair of leaders (hosts i < j; for more than 16
// hosts, only ring neighbours i, i+1 and i, i+2) runs a ping-pong of `bytes`,
// once to warm up and then twice timed, one pair at a time; a pair's rate is
// 2 x bytes over the better round trip. A host's rate is its best pair's: a
// host whose every link is slow is the slow one (with two hosts the two
// ends cannot be told apart, so nothing is named). A host is slow when its
// rate is under a third of the median over hosts. Every exchange has a
// deadline (CommError naming the host that did not answer); nothing else
// runs meanwhile. One host: nothing to measure.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mp {

struct HostLink {
  std::string host;
  std::vector<int> ranks;
  double best_gbit_s = 0;  // the best pair's rate, Gbit/s; 0 with one host
};

struct LinkCheck {
  std::vector<HostLink> hosts;   // in order of their lowest rank
  std::optional<std::string> slow;  // "host node1 (ranks 1, 3) is slow: ..."
  std::string summary() const;   // "node0 1.02, node1 0.10, node2 0.98 Gbit/s"
};

// Collective over MPI_COMM_WORLD; every rank returns the same result.
// `deadline` bounds each ping-pong (mp_worker passes comm.timeout_s).
LinkCheck check_host_links(int64_t bytes, std::chrono::milliseconds deadline);

}  // namespace mp

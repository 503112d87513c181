#include "comm/peer_report.h"

#include <map>
#include <sstream>
#include <utility>

namespace mp {

void PeerMonitor::register_comm(uint64_t id, std::shared_ptr<CommProgress> progress) {
  std::lock_guard<std::mutex> lock(mu_);
  comms_[id] = std::move(progress);
}

void PeerMonitor::unregister_comm(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  comms_.erase(id);
}

void PeerMonitor::progress_of(uint64_t id, uint64_t* words) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = comms_.find(id); it != comms_.end()) {
    words[0] = 1;
    words[1] = it->second->issued.load();
    words[2] = it->second->started.load();
  }
}

}  // namespace mp

namespace mp::comm_detail {

std::string describe_peers(const std::vector<PeerAnswer>& peers, uint64_t sequence, const std::string& here,
                           std::chrono::milliseconds reply_timeout, const char* transport) {
  std::ostringstream behind, unknown, silent;
  int behind_count = 0;
  std::map<std::string, std::pair<std::vector<int>, bool>> by_host;  // host -> (members, one answered)
  for (const PeerAnswer& p : peers) {
    auto& [members_there, answered_there] = by_host[p.host];
    members_there.push_back(p.member);
    answered_there = answered_there || p.answered;
  }
  for (const PeerAnswer& p : peers) {
    if (!p.answered) {
      silent << (silent.tellp() > 0 ? ", " : "") << "rank " << p.member << " on " << p.host;
    } else if (!p.known) {
      unknown << (unknown.tellp() > 0 ? ", " : "") << "rank " << p.member;
    } else if (p.issued < sequence) {
      ++behind_count;
      behind << (behind.tellp() > 0 ? "; " : "") << "rank " << p.member << " (has issued up to #" << p.issued << ")";
    } else if (p.started < sequence) {
      ++behind_count;
      behind << (behind.tellp() > 0 ? "; " : "") << "rank " << p.member << " (issued #" << sequence
             << " but its communication thread is still in #" << p.started << ")";
    }
  }
  std::ostringstream out;
  if (behind_count > 0) out << "Not arrived: " << behind.str() << ". ";
  if (silent.tellp() > 0) {
    out << "No answer within " << reply_timeout.count() << " ms (dead, or stuck outside " << transport
        << "): " << silent.str() << ". ";
  }
  for (const auto& [host, members_there] : by_host) {
    if (members_there.second || host == here) continue;
    out << "Host " << host << " unreachable: none of its ranks answered (";
    for (size_t k = 0; k < members_there.first.size(); ++k) out << (k ? ", " : "") << members_there.first[k];
    out << "): its link or the host is down, or every rank there died. ";
  }
  if (unknown.tellp() > 0) out << "Communicator not (or no longer) present on: " << unknown.str() << ". ";
  if (out.tellp() == 0) out << "Every rank has started it; the transport is stalled.";
  return out.str();
}

}  // namespace mp::comm_detail

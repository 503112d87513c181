#include "comm/mpi/link_check.h"

#include <mpi.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <thread>

#include "comm/mpi/mpi_context.h"
#include "comm/mpi/mpi_error.h"
#include "comm/mpi/mpi_wait.h"
#include "core/error.h"

namespace mp {
namespace {

constexpr int kTag = 7101;

// Waits for `req` until `until`; CommError naming `peer_host` when it does not complete.
void wait_until(MPI_Request& req, std::chrono::steady_clock::time_point until, const std::string& peer_host) {
  for (;;) {
    int done = 0;
    MP_CHECK_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (std::chrono::steady_clock::now() > until) {
      MP_THROW(CommError, "link check: host ", peer_host, " did not answer a ping-pong in time: its link or the host is down");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// One ping-pong of `buf` with `peer` (world rank); returns seconds.
double ping_pong(std::vector<char>& buf, int peer, bool first, std::chrono::milliseconds deadline,
                 const std::string& peer_host) {
  const int n = static_cast<int>(buf.size());
  const auto t0 = std::chrono::steady_clock::now();
  const auto until = t0 + deadline;
  MPI_Request req;
  if (first) {
    MP_CHECK_MPI(MPI_Isend(buf.data(), n, MPI_CHAR, peer, kTag, MPI_COMM_WORLD, &req));
    wait_until(req, until, peer_host);
    MP_CHECK_MPI(MPI_Irecv(buf.data(), n, MPI_CHAR, peer, kTag, MPI_COMM_WORLD, &req));
    wait_until(req, until, peer_host);
  } else {
    MP_CHECK_MPI(MPI_Irecv(buf.data(), n, MPI_CHAR, peer, kTag, MPI_COMM_WORLD, &req));
    wait_until(req, until, peer_host);
    MP_CHECK_MPI(MPI_Isend(buf.data(), n, MPI_CHAR, peer, kTag, MPI_COMM_WORLD, &req));
    wait_until(req, until, peer_host);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<HostLink> group_by_host() {
  const std::vector<std::string> names = gather_processor_names(MPI_COMM_WORLD);
  std::vector<HostLink> hosts;
  std::map<std::string, size_t> index;
  for (size_t r = 0; r < names.size(); ++r) {
    auto [it, fresh] = index.emplace(names[r], hosts.size());
    if (fresh) hosts.push_back(HostLink{names[r], {}, 0});
    hosts[it->second].ranks.push_back(static_cast<int>(r));
  }
  return hosts;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t k = 0; k < ranks.size(); ++k) out << (k ? ", " : "") << ranks[k];
  return out.str();
}

}  // namespace

std::string LinkCheck::summary() const {
  std::ostringstream out;
  out.precision(3);
  for (size_t h = 0; h < hosts.size(); ++h) out << (h ? ", " : "") << hosts[h].host << " " << hosts[h].best_gbit_s;
  out << " Gbit/s";
  return out.str();
}

LinkCheck check_host_links(int64_t bytes, std::chrono::milliseconds deadline) {
  LinkCheck result;
  result.hosts = group_by_host();
  const int H = static_cast<int>(result.hosts.size());
  if (H < 2) return result;
  int rank = 0;
  MP_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  std::vector<std::pair<int, int>> pairs;
  for (int i = 0; i < H; ++i) {
    for (int j = i + 1; j < H; ++j) {
      if (H <= 16 || j - i <= 2 || (i + H - j) <= 2) pairs.emplace_back(i, j);
    }
  }
  std::vector<double> rates(static_cast<size_t>(H) * H, 0.0);  // [i * H + j], filled by leader i
  std::vector<char> buf(static_cast<size_t>(bytes), 1);
  for (const auto& [i, j] : pairs) {
    const HostLink& a = result.hosts[static_cast<size_t>(i)];
    const HostLink& b = result.hosts[static_cast<size_t>(j)];
    const int la = a.ranks.front(), lb = b.ranks.front();
    if (rank != la && rank != lb) continue;
    const bool first = rank == la;
    const int peer = first ? lb : la;
    const std::string& peer_host = first ? b.host : a.host;
    double best = ping_pong(buf, peer, first, deadline, peer_host);  // warm-up
    for (int k = 0; k < 2; ++k) best = std::min(best, ping_pong(buf, peer, first, deadline, peer_host));
    if (first) rates[static_cast<size_t>(i) * H + j] = 2.0 * static_cast<double>(bytes) * 8.0 / best / 1e9;
  }
  MPI_Request req;
  MP_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, rates.data(), static_cast<int>(rates.size()), MPI_DOUBLE, MPI_MAX,
                              MPI_COMM_WORLD, &req));
  mpi_wait(&req);
  for (const auto& [i, j] : pairs) {
    const double r = rates[static_cast<size_t>(i) * H + j];
    auto& hi = result.hosts[static_cast<size_t>(i)].best_gbit_s;
    auto& hj = result.hosts[static_cast<size_t>(j)].best_gbit_s;
    hi = std::max(hi, r);
    hj = std::max(hj, r);
  }
  if (H < 3) return result;  // two ends of one link: which is slow cannot be told
  std::vector<double> best;
  for (const HostLink& h : result.hosts) best.push_back(h.best_gbit_s);
  std::vector<double> sorted = best;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const auto slowest = std::min_element(best.begin(), best.end());
  if (*slowest < median / 3) {
    const HostLink& h = result.hosts[static_cast<size_t>(slowest - best.begin())];
    std::ostringstream out;
    out.precision(3);
    out << "host " << h.host << " (ranks " << rank_list(h.ranks) << ") is slow: its best link to another host ran at "
        << h.best_gbit_s << " Gbit/s against a median of " << median
        << " over the hosts; every collective that spans hosts waits for it";
    result.slow = out.str();
  }
  return result;
}

}  // namespace mp

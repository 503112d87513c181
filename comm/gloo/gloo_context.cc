#include "comm/gloo/gloo_context.h"

#include <arpa/inet.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include "core/error.h"

namespace mp {
namespace {

constexpr uint64_t kQuerySlot = 1;
constexpr uint64_t kReplySlot = uint64_t{1} << 32;  // + the query's nonce
constexpr auto kForever = std::chrono::hours(24 * 365);

std::string this_host() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

}  // namespace

std::string local_address_toward(const std::string& peer) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  std::string out = "127.0.0.1";
  if (peer.empty() || getaddrinfo(peer.c_str(), "9", &hints, &found) != 0) return out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char text[INET6_ADDRSTRLEN] = {};
    // A datagram socket's connect sends nothing: it only picks the route.
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        getnameinfo(reinterpret_cast<sockaddr*>(&local), len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) == 0) {
      out = text;
      close(fd);
      break;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return out;
}

GlooContext::GlooContext(std::shared_ptr<KeyValueStore> store, int rank, int size, const std::string& host,
                         std::chrono::milliseconds timeout)
    : store_(std::move(store)), rank_(rank), size_(size) {
  gloo::transport::tcp::attr attr;
  const char* iface = std::getenv("GLOO_SOCKET_IFNAME");
  if (iface != nullptr && *iface != '\0') {
    attr.iface = iface;
  } else {
    attr.hostname = host.empty() ? "127.0.0.1" : host;
  }
  try {
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    MP_THROW(CommError, "Gloo's TCP device on ", iface != nullptr ? "interface " : "address ",
             iface != nullptr ? iface : attr.hostname.c_str(), ": ", e.what());
  }
  store_->set(detail::str("host/", rank_), this_host());
  for (int r = 0; r < size_; ++r) hosts_.push_back(store_->get(detail::str("host/", r), timeout));
  probe_same_host(timeout);
  monitor_ = connect(rank_, size_, store_gather("monitor", timeout), timeout);
  responder_ = std::thread([this] { respond_loop(); });
}

GlooContext::~GlooContext() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
    if (query_) query_->abortWaitRecv();
  }
  responder_.join();
  monitor_.reset();
  query_.reset();
  answer_.reset();
  kept_.clear();
}

GlooContext::Gather GlooContext::store_gather(const std::string& key, std::chrono::milliseconds timeout) {
  auto rounds = std::make_shared<int>(0);  // each call under keys of its own
  return [this, key, timeout, rounds](const std::string& mine) {
    const std::string at = (*rounds)++ == 0 ? key : detail::str(key, "#", *rounds - 1);
    store_->set(detail::str(at, "/", rank_), mine);
    std::vector<std::string> all(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) all[static_cast<size_t>(r)] = store_->get(detail::str(at, "/", r), timeout);
    return all;
  };
}

// Each member lists the address of its pair for every other member (fixed
// size records, its own left empty); member j connects its pair for i to
// record j of i's list.
std::shared_ptr<gloo::transport::Context> GlooContext::connect(int me, int n, const Gather& gather,
                                                               std::chrono::milliseconds timeout) {
  std::shared_ptr<gloo::transport::Context> ctx = device_->createContext(me, n);
  ctx->setTimeout(timeout);
  std::string mine;
  size_t record = 0;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    const std::vector<char> address = ctx->createPair(j)->address().bytes();
    record = address.size();
    mine.resize(static_cast<size_t>(n) * record);
    std::copy(address.begin(), address.end(), mine.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(j) * record));
  }
  const std::vector<std::string> all = gather(mine);
  MP_ENFORCE_EQ(static_cast<int>(all.size()), n, "the group's addresses");
  try {
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      const std::string& theirs = all[static_cast<size_t>(j)];
      MP_ENFORCE_EQ(theirs.size(), static_cast<size_t>(n) * record, "member ", j, "'s addresses");
      const auto at = theirs.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(me) * record);
      ctx->getPair(j)->connect(std::vector<char>(at, at + static_cast<ptrdiff_t>(record)));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    MP_THROW(CommError, "connecting a Gloo group of ", n, " ranks: ", e.what());
  }
  return ctx;
}

void GlooContext::probe_same_host(std::chrono::milliseconds timeout) {
  const char* mode = std::getenv("MP_GLOO_SAME_HOST");
  const bool allowed = mode == nullptr || std::string(mode) != "tcp";
  if (allowed) (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  probe_ = std::random_device()() * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(getpid());
  store_->set(detail::str("pid/", rank_),
              detail::str(getpid(), " ", reinterpret_cast<uintptr_t>(&probe_), " ", probe_));
  std::string mine(static_cast<size_t>(size_), '0');
  for (int r = 0; r < size_; ++r) {
    std::istringstream in(store_->get(detail::str("pid/", r), timeout));
    int pid = 0;
    uintptr_t at = 0;
    uint64_t want = 0;
    in >> pid >> at >> want;
    pids_.push_back(pid);
    if (!allowed || r == rank_ || host_of(r) != host_of(rank_)) continue;
    uint64_t got = 0;
    iovec local{&got, sizeof(got)}, remote{reinterpret_cast<void*>(at), sizeof(got)};
    if (process_vm_readv(pid, &local, 1, &remote, 1, 0) == sizeof(got) && got == want) mine[static_cast<size_t>(r)] = '1';
  }
  store_->set(detail::str("readable/", rank_), mine);
  for (int r = 0; r < size_; ++r) readable_.push_back(store_->get(detail::str("readable/", r), timeout));
}

std::vector<int> GlooContext::same_host_channels(int me, const std::vector<int>& members, const Gather& gather) {
  const auto n = members.size();
  const int self = members.at(static_cast<size_t>(me));
  auto paired = [&](size_t j) {
    return static_cast<int>(j) != me && same_host_pid(self, members[j]) != 0 && same_host_pid(members[j], self) != 0;
  };
  // Round 1: the lower member of each pair offers the other end of a socket pair.
  std::vector<int> fds(n, -1), offered(n, -1);
  std::string mine(n * sizeof(int), '\0');
  for (size_t j = static_cast<size_t>(me) + 1; j < n; ++j) {
    int sv[2];
    if (paired(j) && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0) fds[j] = sv[0], offered[j] = sv[1];
    std::memcpy(mine.data() + j * sizeof(int), &offered[j], sizeof(int));
  }
  const std::vector<std::string> all = gather(mine);
  // Round 2: the higher member takes its end, and says whether it did.
  std::string took(n, '0');
  for (size_t j = 0; j < static_cast<size_t>(me); ++j) {
    int theirs = -1;
    if (all.at(j).size() == n * sizeof(int)) {
      std::memcpy(&theirs, all[j].data() + static_cast<size_t>(me) * sizeof(int), sizeof(int));
    }
    if (theirs < 0 || !paired(j)) continue;
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pids_.at(static_cast<size_t>(members[j])), 0));
    if (pidfd < 0) continue;
    const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, theirs, 0));
    close(pidfd);
    if (fd >= 0) fds[j] = fd, took[j] = '1';
  }
  const std::vector<std::string> taken = gather(took);
  for (size_t j = static_cast<size_t>(me) + 1; j < n; ++j) {
    if (offered[j] >= 0) close(offered[j]);
    if (fds[j] >= 0 && taken.at(j).size() == n && taken[j][static_cast<size_t>(me)] != '1') {
      close(fds[j]);
      fds[j] = -1;
    }
  }
  return fds;
}

// Query: {comm id, nonce}. Reply, on kReplySlot + nonce: {nonce, known (0/1), issued, started}.
void GlooContext::respond_loop() {
  std::vector<int> others;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) others.push_back(r);
  }
  if (others.empty()) return;
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stop_) return;
    query_ = monitor_->createUnboundBuffer(query_data_.data(), sizeof(query_data_));
  }
  answer_ = monitor_->createUnboundBuffer(reply_data_.data(), sizeof(reply_data_));
  const auto& query = query_data_;
  auto& reply = reply_data_;
  try {
    while (true) {
      query_->recv(others, kQuerySlot);
      int from = -1;
      if (!query_->waitRecv(&from, kForever)) return;  // aborted: the context is closing
      reply = {query[1], 0, 0, 0};
      progress_of(query[0], &reply[1]);
      answer_->send(from, kReplySlot + (query[1] & 0xffffffffu));
      answer_->waitSend(kForever);  // the asker has posted its receive
    }
  } catch (const std::exception&) {
    // A peer's connection closed: this process no longer answers (Note [Gloo
    // peer monitor]); its own collectives report the closed peer.
  }
}

std::string GlooContext::diagnose(uint64_t id, uint64_t sequence, const std::vector<int>& members,
                                  std::chrono::milliseconds reply_timeout) {
  std::lock_guard<std::mutex> lock(diagnose_mu_);
  const uint64_t nonce = ++nonce_ & 0xffffffffu;
  auto query = std::make_shared<std::array<uint64_t, 2>>(std::array<uint64_t, 2>{id, nonce});
  kept_.push_back(query);
  struct Peer {
    comm_detail::PeerAnswer answer;
    int world = 0;
    std::shared_ptr<std::array<uint64_t, 4>> reply = std::make_shared<std::array<uint64_t, 4>>();
    std::shared_ptr<gloo::transport::UnboundBuffer> buffer;
  };
  std::vector<Peer> peers;
  for (int m = 0; m < static_cast<int>(members.size()); ++m) {
    const int w = members[static_cast<size_t>(m)];
    if (w == rank_) continue;
    Peer& p = peers.emplace_back();
    p.answer.member = m;
    p.answer.host = host_of(w);
    p.world = w;
    try {
      p.buffer = monitor_->createUnboundBuffer(p.reply->data(), sizeof(*p.reply));
      p.buffer->recv(w, kReplySlot + nonce);
      std::shared_ptr<gloo::transport::UnboundBuffer> ask =
          monitor_->createUnboundBuffer(query->data(), sizeof(*query));
      ask->send(w, kQuerySlot);
      kept_.push_back(ask);
    } catch (const std::exception&) {
      p.buffer.reset();  // its connection is closed: no answer
    }
  }
  // The watchdog aborts the receives still pending at the deadline.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, reply_timeout, [&] { return done; })) {
      for (Peer& p : peers) {
        if (p.buffer) p.buffer->abortWaitRecv();
      }
    }
  });
  std::vector<comm_detail::PeerAnswer> answers;
  for (Peer& p : peers) {
    if (p.buffer) {
      try {
        (void)p.buffer->waitRecv(nullptr, kForever);
      } catch (const std::exception&) {
      }
      kept_.push_back(p.buffer);
      kept_.push_back(p.reply);
    }
    const auto& r = *p.reply;
    p.answer.answered = r[0] == nonce;
    p.answer.known = r[1] != 0;
    p.answer.issued = r[2];
    p.answer.started = r[3];
    answers.push_back(p.answer);
  }
  {
    std::lock_guard<std::mutex> l(mu);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
  return comm_detail::describe_peers(answers, sequence, host_of(rank_), reply_timeout, "Gloo");
}

}  // namespace mp

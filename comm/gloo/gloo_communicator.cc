#include "comm/gloo/gloo_communicator.h"

#include <gloo/transport/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <stdexcept>
#include <thread>

#include "comm/backend_util.h"
#include "comm/host_rounds.h"
#include "core/error.h"
#include "kernels/convert.h"

namespace mp {

// Note [Same-host transfers] (comm/gloo/gloo_context.h), per member of a
// communicator: the pid whose memory this rank reads what that member sends
// (0: TCP), whether what this rank sends it is read so, and this end of the
// channel to it (-1: none; its messages go through Gloo).
struct ChannelMessage {
  enum Kind : uint64_t { kInline, kAddress, kAck };
  uint64_t slot = 0, kind = kInline, address = 0, bytes = 0;
  std::vector<char> data;  // kInline's bytes
};
struct GlooSameHost {
  std::vector<int> recv_pid;
  std::vector<bool> send;
  std::vector<int> channel;
  std::vector<std::deque<ChannelMessage>> early;  // per member: arrived before they were waited for
  ~GlooSameHost() {
    for (int fd : channel) {
      if (fd >= 0) close(fd);
    }
  }
};

namespace {

using comm_detail::ChunkSplit;
using comm_detail::element_ptr;

// The fingerprint check's exchange precedes the collective's own, on slots of
// its own.
constexpr uint64_t kFingerprintRound = 0xfff000;

// `bytes` of `pid`'s memory at `from` into `to` (Note [Same-host transfers]).
void read_memory(int pid, void* to, uintptr_t from, size_t bytes) {
  for (size_t done = 0; done < bytes;) {
    iovec local{static_cast<char*>(to) + done, bytes - done};
    iovec remote{reinterpret_cast<char*>(from) + done, bytes - done};
    const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      throw std::runtime_error(detail::str("reading ", bytes, " bytes of its memory (pid ", pid,
                                           ", this host): ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
}

using Clock = std::chrono::steady_clock;

// Waits until `fd` is ready for `events`, at most until `deadline`.
void wait_ready(int fd, short events, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  pollfd p{fd, events, 0};
  const int n = poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 0, INT32_MAX)));
  if (n == 0) throw std::runtime_error("no message on its same-host channel before the deadline");
  if (n < 0 && errno != EINTR) throw std::runtime_error(detail::str("its same-host channel: ", std::strerror(errno)));
}

// One message (a header, then kInline's bytes) on a same-host channel.
void channel_send(int fd, const ChannelMessage& m, const void* data, Clock::time_point deadline) {
  std::array<uint64_t, 4> head{m.slot, m.kind, m.address, m.bytes};
  const size_t inline_bytes = m.kind == ChannelMessage::kInline ? m.bytes : 0;
  iovec iov[2] = {{head.data(), sizeof(head)}, {const_cast<void*>(data), inline_bytes}};
  msghdr h{};
  h.msg_iov = iov;
  h.msg_iovlen = 2;
  while (sendmsg(fd, &h, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
    if (errno != EAGAIN && errno != EINTR) {
      throw std::runtime_error(detail::str("its same-host channel: ", std::strerror(errno)));
    }
    wait_ready(fd, POLLOUT, deadline);
  }
}

// A message is waited for yielding for its first kChannelSpin, as MPI's
// waits (Note [Waiting on MPI]) but shorter, then blocked for in poll.
constexpr auto kChannelSpin = std::chrono::microseconds(200);

ChannelMessage channel_recv(int fd, Clock::time_point deadline) {
  std::array<uint64_t, 4> head{};
  ChannelMessage m;
  m.data.resize(kSameHostMinBytes);
  iovec iov[2] = {{head.data(), sizeof(head)}, {m.data.data(), m.data.size()}};
  msghdr h{};
  h.msg_iov = iov;
  h.msg_iovlen = 2;
  ssize_t n = 0;
  const Clock::time_point spin_until = Clock::now() + kChannelSpin;
  while ((n = recvmsg(fd, &h, MSG_DONTWAIT)) < 0) {
    if (errno != EAGAIN && errno != EINTR) {
      throw std::runtime_error(detail::str("its same-host channel: ", std::strerror(errno)));
    }
    Clock::now() < spin_until ? std::this_thread::yield() : wait_ready(fd, POLLIN, deadline);
  }
  if (n == 0) throw std::runtime_error("its process closed its same-host channel");
  if (static_cast<size_t>(n) < sizeof(head) || (h.msg_flags & MSG_TRUNC) != 0) {
    throw std::runtime_error(detail::str("a malformed message of ", n, " bytes on its same-host channel"));
  }
  m.slot = head[0], m.kind = head[1], m.address = head[2], m.bytes = head[3];
  m.data.resize(static_cast<size_t>(n) - sizeof(head));
  return m;
}

// The transfers of one round of a collective, in flight together, waited
// for as a whole (Note [Gloo backend]). Each round has a slot of its own.
class Exchange {
 public:
  using Failed = std::function<void(int peer, bool sending, const std::exception&)>;
  Exchange(gloo::transport::Context& ctx, const CollectiveInfo& info, uint64_t round, std::chrono::milliseconds timeout,
           const Failed* failed, GlooSameHost* same_host)
      : ctx_(ctx), slot_((info.sequence << 24) | (round & 0xffffff)), timeout_(timeout), failed_(failed),
        same_host_(same_host) {}
  Exchange(Exchange&&) = default;

  void send(int peer, const void* data, size_t bytes) { post(peer, const_cast<void*>(data), bytes, true); }
  void recv(int peer, void* data, size_t bytes) { post(peer, data, bytes, false); }
  // Receives first (a same-host one reads and acknowledges), then sends (a
  // same-host one waits for its acknowledgement): no rank waits for one
  // that waits for it.
  void wait() {
    for (Op& op : ops_) {
      if (!op.sending) guard(op, [&] { receive(op); });
    }
    for (Op& op : ops_) {
      if (op.sending) guard(op, [&] {
        if (op.buffer) op.buffer->waitSend(timeout_);
        if (op.ack) op.ack->waitRecv(timeout_);
        if (op.channel_ack) (void)take(op.peer, true);
      });
      if (!op.sending && op.ack) guard(op, [&] { op.ack->waitSend(timeout_); });
    }
    ops_.clear();
  }

 private:
  static constexpr uint64_t kAck = uint64_t{1} << 63;
  struct Op {
    int peer = 0;
    bool sending = false;
    void* data = nullptr;
    size_t bytes = 0;
    bool channel_ack = false;            // sent by address on the channel: wait for its acknowledgement
    int pid = 0;                         // same host, receiving: whose memory to read
    std::array<uint64_t, 2> where{};     // same host: the sender's address and length
    uint64_t acked = 0;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer, ack;
  };

  template <class F>
  void guard(const Op& op, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      (*failed_)(op.peer, op.sending, e);
    }
  }

  int channel(int peer) const { return same_host_->channel[static_cast<size_t>(peer)]; }
  Clock::time_point deadline() const { return Clock::now() + timeout_; }

  void post(int peer, void* data, size_t bytes, bool sending) {
    if (bytes == 0) return;
    Op& op = ops_.emplace_back();
    op.peer = peer, op.sending = sending, op.data = data, op.bytes = bytes;
    const bool same_host = bytes >= kSameHostMinBytes && (sending ? same_host_->send[static_cast<size_t>(peer)]
                                                                   : same_host_->recv_pid[static_cast<size_t>(peer)] != 0);
    op.pid = same_host && !sending ? same_host_->recv_pid[static_cast<size_t>(peer)] : 0;
    guard(op, [&] {
      if (channel(peer) >= 0) {
        if (!sending) return;  // taken from the channel in wait()
        ChannelMessage m{slot_, same_host ? ChannelMessage::kAddress : ChannelMessage::kInline,
                         reinterpret_cast<uintptr_t>(data), bytes, {}};
        channel_send(channel(peer), m, data, deadline());
        op.channel_ack = same_host;
      } else if (!same_host) {
        op.buffer = ctx_.createUnboundBuffer(data, bytes);
      } else {
        op.where = {reinterpret_cast<uintptr_t>(data), bytes};
        op.buffer = ctx_.createUnboundBuffer(op.where.data(), sizeof(op.where));
        op.ack = ctx_.createUnboundBuffer(&op.acked, sizeof(op.acked));
        if (sending) op.ack->recv(peer, slot_ | kAck);
      }
      if (op.buffer) sending ? op.buffer->send(peer, slot_) : op.buffer->recv(peer, slot_);
    });
  }

  void receive(Op& op) {
    if (channel(op.peer) < 0) {
      op.buffer->waitRecv(timeout_);
      if (op.pid != 0) read_from_peer(op);
      return;
    }
    ChannelMessage m = take(op.peer, false);
    if (m.bytes != op.bytes) {
      throw std::runtime_error(detail::str("it sends ", m.bytes, " bytes where ", op.bytes, " are expected"));
    }
    if (m.kind == ChannelMessage::kInline) {
      std::memcpy(op.data, m.data.data(), op.bytes);
      return;
    }
    read_memory(op.pid, op.data, m.address, op.bytes);
    channel_send(channel(op.peer), ChannelMessage{slot_, ChannelMessage::kAck, 0, 0, {}}, nullptr, deadline());
  }

  // This round's message from `peer` (its acknowledgement, or its data):
  // messages of other rounds that come first are kept for their own.
  ChannelMessage take(int peer, bool ack) {
    auto match = [&](const ChannelMessage& m) { return m.slot == slot_ && (m.kind == ChannelMessage::kAck) == ack; };
    auto& early = same_host_->early[static_cast<size_t>(peer)];
    for (auto it = early.begin(); it != early.end(); ++it) {
      if (match(*it)) {
        ChannelMessage m = std::move(*it);
        early.erase(it);
        return m;
      }
    }
    const Clock::time_point until = deadline();
    while (true) {
      ChannelMessage m = channel_recv(channel(peer), until);
      if (match(m)) return m;
      early.push_back(std::move(m));
    }
  }

  void read_from_peer(Op& op) {
    if (op.where[1] != op.bytes) {
      throw std::runtime_error(detail::str("it sends ", op.where[1], " bytes where ", op.bytes, " are expected"));
    }
    read_memory(op.pid, op.data, op.where[0], op.bytes);
    op.ack->send(op.peer, slot_ | kAck);
  }

  gloo::transport::Context& ctx_;
  uint64_t slot_;
  std::chrono::milliseconds timeout_;
  const Failed* failed_;
  GlooSameHost* same_host_;
  std::deque<Op> ops_;  // stable: the transfers point into them
};

// Note [Chunked reduction]'s exchange over Gloo (comm/host_rounds.h). With
// an input of kSameHostMinBytes or more, a same-host peer's part of each
// round is read where it lies in its input (Note [Same-host transfers]):
// its input's address comes once, before the rounds, and a last message
// tells it the reading is done (it may then reuse its input); rounds then
// cost it no message.
class GlooRounds final : public comm_detail::HostRounds {
 public:
  GlooRounds(std::function<Exchange()> make, const Exchange::Failed* failed, const GlooSameHost& same, size_t elem,
             int rank, int size, const Tensor& input, const Tensor& scratch, const Tensor& out, math::ElementOp op,
             double divisor, bool wire)
      : HostRounds(rank, size, input, scratch, out, op, divisor, wire), make_(std::move(make)), failed_(failed),
        same_(same), elem_(elem),
        direct_(static_cast<size_t>(input.numel()) * elem >= kSameHostMinBytes),
        bases_(static_cast<size_t>(size)) {}

  void begin() { handshake(std::array<uint64_t, 2>{reinterpret_cast<uintptr_t>(input_.data()), 0}, true); }
  void end() { handshake(std::array<uint64_t, 2>{1, 0}, false); }

  void start(const ChunkSplit& split, int64_t begin, int64_t piece, int64_t recv, int slot) override {
    Exchange& ex = rounds_[slot].emplace(make_());
    reads_[slot].clear();
    for (int j = 0; j < size_; ++j) {
      char* dst = place(split, begin, piece, slot, j);
      if (j == rank_) continue;
      const auto jj = static_cast<size_t>(j);
      const int64_t send = std::clamp<int64_t>(split.counts[jj] - begin, 0, piece);
      if (reads(j)) {
        const uintptr_t at = bases_[jj][0] + static_cast<uintptr_t>(split.offsets[static_cast<size_t>(rank_)] + begin) * elem_;
        reads_[slot].push_back({j, dst, at, static_cast<size_t>(recv) * elem_});
      } else {
        ex.recv(j, dst, static_cast<size_t>(recv) * elem_);
      }
      if (!read_by(j)) ex.send(j, outgoing(split, begin, j), static_cast<size_t>(send) * elem_);
    }
  }

  void finish(int slot) override {
    rounds_[slot]->wait();
    for (const Read& r : reads_[slot]) {
      try {
        if (r.bytes > 0) read_memory(same_.recv_pid[static_cast<size_t>(r.peer)], r.to, r.from, r.bytes);
      } catch (const std::exception& e) {
        (*failed_)(r.peer, false, e);
      }
    }
  }

 private:
  struct Read {
    int peer;
    char* to;
    uintptr_t from;
    size_t bytes;
  };
  bool reads(int j) const { return direct_ && same_.recv_pid[static_cast<size_t>(j)] != 0; }
  bool read_by(int j) const { return direct_ && same_.send[static_cast<size_t>(j)]; }

  // first: this rank's input's address to every peer that reads it, theirs
  // from every peer it reads; then: "done" to every peer it read, from
  // every peer that read it.
  void handshake(std::array<uint64_t, 2> mine, bool first) {
    if (!direct_) return;
    Exchange ex = make_();
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      const bool to = first ? read_by(j) : reads(j), from = first ? reads(j) : read_by(j);
      if (to) ex.send(j, mine.data(), sizeof(mine));
      if (from) ex.recv(j, bases_[static_cast<size_t>(j)].data(), sizeof(mine));
    }
    ex.wait();
  }

  std::function<Exchange()> make_;
  const Exchange::Failed* failed_;
  const GlooSameHost& same_;
  size_t elem_;
  bool direct_;
  std::vector<std::array<uint64_t, 2>> bases_;  // each peer's input (then its "done")
  std::optional<Exchange> rounds_[2];
  std::vector<Read> reads_[2];
};

}  // namespace

std::unique_ptr<GlooCommunicator> GlooCommunicator::create_world(std::shared_ptr<KeyValueStore> store, int rank,
                                                                 int size, const std::string& host,
                                                                 const std::string& name, CommOptions options) {
  MP_ENFORCE(rank >= 0 && rank < size, "Gloo world of ", size, " ranks, this one ", rank);
  auto ctx = std::make_shared<GlooContext>(std::move(store), rank, size, host, options.timeout);
  std::vector<int> all(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) all[static_cast<size_t>(r)] = r;
  const GlooContext::Gather gather = ctx->store_gather("world/" + name, options.timeout);
  auto gloo = ctx->connect(rank, size, gather, options.timeout);
  std::vector<int> channels = ctx->same_host_channels(rank, all, gather);
  return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(std::move(ctx), std::move(gloo), std::move(all),
                                                                std::move(channels), comm_detail::mix(0x676c6f6f, 1),
                                                                name, options));
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<GlooContext> ctx, std::shared_ptr<gloo::transport::Context> gloo,
                                   std::vector<int> members, std::vector<int> channels, uint64_t id, std::string name,
                                   CommOptions options)
    : HostCommunicator(std::move(name), options, id, ctx), ctx_(std::move(ctx)), gloo_(std::move(gloo)) {
  members_ = std::move(members);
  rank_ = gloo_->rank;
  size_ = gloo_->size;
  same_host_ = std::make_shared<GlooSameHost>();
  same_host_->channel = std::move(channels);
  same_host_->early.resize(static_cast<size_t>(size_));
  for (int j = 0; j < size_; ++j) {
    const int world = members_[static_cast<size_t>(j)], me = members_[static_cast<size_t>(rank_)];
    same_host_->recv_pid.push_back(j == rank_ ? 0 : ctx_->same_host_pid(me, world));
    same_host_->send.push_back(j != rank_ && ctx_->same_host_pid(world, me) != 0);
  }
  ctx_->register_comm(id_, progress_);
}

GlooCommunicator::~GlooCommunicator() {
  ctx_->unregister_comm(id_);
  if (cpu_streams_abandoned()) {  // a collective timed out: its thread may still use the connections
    static auto* kept = new std::vector<std::shared_ptr<void>>();  // until exit, reachable
    kept->push_back(gloo_);
    kept->push_back(ctx_);
    kept->push_back(same_host_);
    return;
  }
  try {
    stream_.synchronize();
  } catch (...) {
    // The failure was reported through the Work that carried it.
  }
}

int GlooCommunicator::same_host_channels() const {
  const std::vector<int>& fds = same_host_->channel;
  return static_cast<int>(std::count_if(fds.begin(), fds.end(), [](int fd) { return fd >= 0; }));
}

void GlooCommunicator::gather_fingerprints(const CollectiveInfo& info, const std::array<int64_t, 4>& mine,
                                           std::vector<int64_t>& all) {
  host_gather(info, mine.data(), sizeof(mine), all.data(), kFingerprintRound);
}

namespace {

// Transfers of collective `info` on `comm`'s connections: a failed one is a
// CommError naming the peer, with where the others are.
struct Transfers {
  gloo::transport::Context& ctx;
  const CollectiveInfo& info;
  std::chrono::milliseconds timeout;
  Exchange::Failed failed;
  GlooSameHost* same_host;
  uint64_t rounds = 0;
  Exchange next() { return Exchange(ctx, info, rounds++, timeout, &failed, same_host); }
};

}  // namespace

#define MP_GLOO_TRANSFERS(t, info)                                                                                \
  Transfers t{*gloo_, info, 4 * options().timeout + options().diagnose_timeout + std::chrono::seconds(10),                                 \
              [this, &info](int peer, bool sending, const std::exception& e) {                                   \
                MP_THROW(CommError, info.describe(), " on communicator '", name(), "': the transfer ",           \
                         sending ? "to" : "from", " rank ", peer, " (on ", ctx_->host_of(members_[peer]),        \
                         ") failed: ", e.what(), ". ", diagnoser()(info));                                        \
              },                                                                                                  \
              same_host_.get()}

void GlooCommunicator::host_gather(const CollectiveInfo& info, const void* mine, size_t bytes, void* all,
                                   uint64_t round) {
  MP_GLOO_TRANSFERS(t, info);
  t.rounds = round;
  Exchange ex = t.next();
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    ex.send(j, mine, bytes);
    ex.recv(j, static_cast<char*>(all) + static_cast<size_t>(j) * bytes, bytes);
  }
  std::memcpy(static_cast<char*>(all) + static_cast<size_t>(rank_) * bytes, mine, bytes);
  ex.wait();
}

// Note [Ring all-gather] (comm/mpi/mpi_communicator.cc).
void GlooCommunicator::gather_ring(const CollectiveInfo& info, const void* mine, const Tensor& output,
                                   const ChunkSplit& split) {
  MP_GLOO_TRANSFERS(t, info);
  const size_t elem = dtype_size(output.dtype());
  const auto own = static_cast<size_t>(rank_);
  char* slot = element_ptr(output, split.offsets[own]);
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  for (int s = 0; s + 1 < size_; ++s) {
    const auto send = static_cast<size_t>((rank_ - s + size_) % size_);
    const auto recv = static_cast<size_t>((rank_ - s - 1 + 2 * size_) % size_);
    Exchange ex = t.next();
    ex.recv(left, element_ptr(output, split.offsets[recv]), static_cast<size_t>(split.counts[recv]) * elem);
    ex.send(right, s == 0 ? mine : element_ptr(output, split.offsets[send]),
            static_cast<size_t>(split.counts[send]) * elem);
    if (s == 0 && mine != slot) std::memcpy(slot, mine, static_cast<size_t>(split.counts[own]) * elem);
    ex.wait();
  }
  if (size_ == 1 && mine != slot) std::memcpy(slot, mine, static_cast<size_t>(split.counts[own]) * elem);
}

void GlooCommunicator::accumulate_chunks(const CollectiveInfo& info, const Tensor& input, const ChunkSplit& split,
                                         const Tensor& out, math::ElementOp op, double divisor, bool wire) {
  if (split.longest() == 0) return;
  const int64_t piece =
      comm_detail::host_round_piece(options().accumulate_chunk_bytes, input, size_, allocator_, &scratch_);
  MP_GLOO_TRANSFERS(t, info);
  GlooRounds rounds([&t] { return t.next(); }, &t.failed, *same_host_, dtype_size(input.dtype()), rank_, size_, input,
                    scratch_, out, op, divisor, wire);
  rounds.begin();
  comm_detail::reduce_chunks(rounds, split, rank_, piece);
  rounds.end();
}

WorkPtr GlooCommunicator::do_broadcast(const Tensor& tensor, int root) {
  return issue({"broadcast", 0, tensor.dtype(), tensor.numel()}, [=, this](const CollectiveInfo& info) {
    MP_GLOO_TRANSFERS(t, info);
    Exchange ex = t.next();
    const size_t bytes = static_cast<size_t>(tensor.numel()) * dtype_size(tensor.dtype());
    for (int j = 0; j < size_; ++j) {
      if (rank_ == root && j != root) ex.send(j, tensor.data(), bytes);
    }
    if (rank_ != root) ex.recv(root, tensor.data(), bytes);
    ex.wait();
  });
}

WorkPtr GlooCommunicator::do_all_to_all(const Tensor& input, const Tensor& output, bool in_place) {
  const int64_t n = input.numel() / size_;
  const std::vector<int64_t> counts(static_cast<size_t>(size_), n);
  if (!in_place) return exchange_all({"all_to_all", 0, input.dtype(), n}, input, counts, output, counts);
  // In place: the input is read from a copy, which lives until the exchange is done.
  auto copy = std::make_shared<Tensor>(
      Tensor::empty(allocator_, input.dtype(), {input.numel()}, MemCategory::kCommScratch));
  const size_t bytes = static_cast<size_t>(input.numel()) * dtype_size(input.dtype());
  stream_.submit([=] { std::memcpy(copy->data(), input.data(), bytes); });
  WorkPtr w = exchange_all({"all_to_all", 0, input.dtype(), n}, *copy, counts, output, counts);
  stream_.submit([copy] {});
  return w;
}

// The counts differ between ranks, so the fingerprint's count is 0 (as MPI's).
WorkPtr GlooCommunicator::do_all_to_all_v(const Tensor& input, const std::vector<int64_t>& send_counts,
                                          const Tensor& output, const std::vector<int64_t>& recv_counts) {
  return exchange_all({"all_to_all_v", 0, input.dtype(), 0}, input, send_counts, output, recv_counts);
}

WorkPtr GlooCommunicator::exchange_all(CollectiveInfo what, const Tensor& input, const std::vector<int64_t>& send_counts,
                                       const Tensor& output, const std::vector<int64_t>& recv_counts) {
  return issue(std::move(what), [=, this](const CollectiveInfo& info) {
    MP_GLOO_TRANSFERS(t, info);
    Exchange ex = t.next();
    const size_t elem = dtype_size(input.dtype());
    int64_t s_at = 0, r_at = 0;
    for (int j = 0; j < size_; ++j) {
      const auto jj = static_cast<size_t>(j);
      const auto sent = static_cast<size_t>(send_counts[jj]) * elem, got = static_cast<size_t>(recv_counts[jj]) * elem;
      if (j == rank_) {
        MP_ENFORCE_EQ(sent, got, "all_to_all_v: this rank's count to itself");
        if (sent > 0) std::memcpy(element_ptr(output, r_at), element_ptr(input, s_at), sent);
      } else {
        ex.send(j, element_ptr(input, s_at), sent);
        ex.recv(j, element_ptr(output, r_at), got);
      }
      s_at += send_counts[jj];
      r_at += recv_counts[jj];
    }
    ex.wait();
  });
}

void GlooCommunicator::do_host_all_gather(const void* mine, size_t bytes, void* all) {
  // Waited for before this returns: the body may borrow the caller's buffers.
  issue({"host_all_gather", 0, DType::kF32, static_cast<int64_t>(bytes)},
        [=, this](const CollectiveInfo& info) { host_gather(info, mine, bytes, all); })
      ->wait();
}

WorkPtr GlooCommunicator::barrier() {
  return issue({"barrier", 0, DType::kF32, 0}, [this](const CollectiveInfo& info) {
    std::vector<char> all(static_cast<size_t>(size_));
    const char mine = 1;
    host_gather(info, &mine, 1, all.data());
  });
}

std::unique_ptr<GlooCommunicator> GlooCommunicator::split(int color, int key, const std::string& name,
                                                          const CommOptions& options) {
  const std::array<int64_t, 2> mine{color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(size_));
  issue({"split", 0, DType::kF32, 0}, [&](const CollectiveInfo& info) {
    host_gather(info, mine.data(), sizeof(mine), all.data());
  })->wait();
  const uint64_t id = child_id(color);
  std::vector<int> order;  // members of this rank's new group, by (key, rank)
  for (int r = 0; r < size_ && color >= 0; ++r) {
    if (all[2 * static_cast<size_t>(r)] == color) order.push_back(r);
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return all[2 * static_cast<size_t>(a) + 1] < all[2 * static_cast<size_t>(b) + 1];
  });
  // The new groups' addresses go over this communicator (every rank takes
  // part; a rank without a color sends nothing).
  const GlooContext::Gather over_parent = [&](const std::string& addresses) {
    const std::vector<std::string> every = all_gather_bytes(addresses);
    std::vector<std::string> group;
    for (int r : order) group.push_back(every[static_cast<size_t>(r)]);
    return group;
  };
  if (color < 0) {
    for (int round = 0; round < 3; ++round) over_parent(std::string());  // as connect and same_host_channels
    return nullptr;
  }
  const int me = static_cast<int>(std::find(order.begin(), order.end(), rank_) - order.begin());
  auto gloo = ctx_->connect(me, static_cast<int>(order.size()), over_parent, options.timeout);
  std::vector<int> world(order.size());
  for (size_t i = 0; i < order.size(); ++i) world[i] = members_[static_cast<size_t>(order[i])];
  std::vector<int> channels = ctx_->same_host_channels(me, world, over_parent);
  return std::unique_ptr<GlooCommunicator>(
      new GlooCommunicator(ctx_, std::move(gloo), std::move(world), std::move(channels), id, name, options));
}

}  // namespace mp

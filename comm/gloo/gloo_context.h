// comm/gloo/gloo_context.h: what all Gloo communicators of a job share: the
// store the ranks meet through, the TCP device, every rank's host, and the
// peer monitor (Note [Peer monitor] in comm/mpi/mpi_context.h) over a Gloo
// context of its own.
//
// Note [Same-host transfers]
// Between two ranks of one host, TCP over loopback copies every byte twice
// through the kernel. A transfer of kSameHostMinBytes or more goes instead
// as MPI's shared-memory transport sends large messages (Open MPI's
// single-copy CMA): the sender sends only the buffer's address and length,
// the receiver reads it straight from the sender's memory
// (process_vm_readv) and acknowledges, and only then may the sender reuse
// it. Whether rank j may read rank i's memory is probed once, at start-up,
// for every pair on one host (same user, same PID namespace, no ptrace
// restriction: each process allows it with PR_SET_PTRACER, as Open MPI
// does); pairs that fail the probe, or MP_GLOO_SAME_HOST=tcp, use TCP.
// Such a pair's messages (the addresses, the acknowledgements, and whole
// transfers under kSameHostMinBytes) do not go through Gloo either: each
// communicator has a Unix socket per same-host peer (SOCK_SEQPACKET: one
// message per send, in order), which the lower member creates as a pair
// and the higher takes its end of with pidfd_getfd (the same permission as
// the reads). The communication thread sends and waits on it itself, where
// a Gloo message is handled by Gloo's device thread, which woke, and with
// two ranks on two cores spun, dozens of times per collective.
//
// Note [Gloo peer monitor]
// A responder thread per process waits, without a deadline, for a query from
// any rank on the monitor's context and answers with the communicator's
// progress. A Gloo wait that times out closes every pair of its context, so
// no wait on the monitor's context ever times out: a diagnosis posts its
// receives, and a watchdog aborts the ones still pending at the reply
// timeout (abortWaitRecv: the context stays up). A buffer a transfer may
// still write is never freed before the context is; a dead peer's closed
// connection fails its transfers at once (no answer).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/peer_report.h"
#include "comm/store.h"

namespace gloo::transport {
class Context;
class Device;
class UnboundBuffer;
}  // namespace gloo::transport

namespace mp {

constexpr size_t kSameHostMinBytes = size_t{64} << 10;

class GlooContext final : public PeerMonitor {
 public:
  // Collective over the `size` processes that meet in `store`: each binds
  // its TCP device to `host` (an address the others reach; GLOO_SOCKET_IFNAME
  // names an interface instead) and every wait on the store is bounded by
  // `timeout`.
  GlooContext(std::shared_ptr<KeyValueStore> store, int rank, int size, const std::string& host,
              std::chrono::milliseconds timeout);
  ~GlooContext() override;
  GlooContext(const GlooContext&) = delete;
  GlooContext& operator=(const GlooContext&) = delete;

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  // Note [Same-host transfers]: the pid through which `reader` reads
  // `owner`'s memory, or 0 when transfers between them go over TCP.
  int same_host_pid(int reader, int owner) const {
    return readable_.at(static_cast<size_t>(reader)).at(static_cast<size_t>(owner)) == '1'
               ? pids_.at(static_cast<size_t>(owner))
               : 0;
  }
  const std::string& host_of(int world_rank) const { return hosts_.at(static_cast<size_t>(world_rank)); }

  // Every member's bytes, in member order, for this member's `mine`.
  using Gather = std::function<std::vector<std::string>(const std::string& mine)>;
  // Collective over the `n` members of a group (this one is member `me`): a
  // full mesh of TCP connections, whose addresses `gather` exchanges.
  std::shared_ptr<gloo::transport::Context> connect(int me, int n, const Gather& gather,
                                                    std::chrono::milliseconds timeout);
  // A Gather through the store, under `key`: every world rank takes part.
  Gather store_gather(const std::string& key, std::chrono::milliseconds timeout);
  // Note [Same-host transfers]: collective over a group's members (world
  // ranks, this one member `me`), through two rounds of `gather`: for each
  // member, this process's end of a Unix socket to it, or -1 (no same-host
  // channel: the member is this one, on another host, or unreadable).
  std::vector<int> same_host_channels(int me, const std::vector<int>& members, const Gather& gather);

  // Note [Gloo peer monitor]: asks every other member where it is on
  // communicator `id` and describes those not at `sequence`.
  std::string diagnose(uint64_t id, uint64_t sequence, const std::vector<int>& members,
                       std::chrono::milliseconds reply_timeout) override;

 private:
  void respond_loop();
  void probe_same_host(std::chrono::milliseconds timeout);

  std::shared_ptr<KeyValueStore> store_;
  int rank_, size_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::vector<std::string> hosts_;
  std::vector<int> pids_;
  std::vector<std::string> readable_;  // [reader][owner]: '1' where the probe read owner's memory
  uint64_t probe_ = 0;                 // the word the others read
  std::shared_ptr<gloo::transport::Context> monitor_;
  std::mutex diagnose_mu_;
  uint64_t nonce_ = 0;
  std::vector<std::shared_ptr<void>> kept_;  // buffers a transfer may still write (guarded by diagnose_mu_)
  // The responder's buffers (after monitor_: a transfer may still use them).
  std::array<uint64_t, 2> query_data_{};
  std::array<uint64_t, 4> reply_data_{};
  std::unique_ptr<gloo::transport::UnboundBuffer> query_, answer_;
  std::mutex stop_mu_;
  bool stop_ = false;
  std::thread responder_;
};

// The address of this host's interface toward `peer` (a host name or
// address): the one a connection to it would leave from; "127.0.0.1" when
// `peer` is empty or unreachable.
std::string local_address_toward(const std::string& peer);

}  // namespace mp

// comm/gloo/gloo_context.h: what all Gloo communicators of a job share: the
// store the ranks meet through, the TCP device, every rank's host, and the
// peer monitor (Note [Peer monitor] in comm/mpi/mpi_context.h) over a Gloo
// context of its own.
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
#include <map>
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

class GlooContext {
 public:
  // Collective over the `size` processes that meet in `store`: each binds
  // its TCP device to `host` (an address the others reach; GLOO_SOCKET_IFNAME
  // names an interface instead) and every wait on the store is bounded by
  // `timeout`.
  GlooContext(std::shared_ptr<KeyValueStore> store, int rank, int size, const std::string& host,
              std::chrono::milliseconds timeout);
  ~GlooContext();
  GlooContext(const GlooContext&) = delete;
  GlooContext& operator=(const GlooContext&) = delete;

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  const std::string& host_of(int world_rank) const { return hosts_.at(static_cast<size_t>(world_rank)); }

  // Every member's bytes, in member order, for this member's `mine`.
  using Gather = std::function<std::vector<std::string>(const std::string& mine)>;
  // Collective over the `n` members of a group (this one is member `me`): a
  // full mesh of TCP connections, whose addresses `gather` exchanges.
  std::shared_ptr<gloo::transport::Context> connect(int me, int n, const Gather& gather,
                                                    std::chrono::milliseconds timeout);
  // A Gather through the store, under `key`: every world rank takes part.
  Gather store_gather(const std::string& key, std::chrono::milliseconds timeout);

  void register_comm(uint64_t id, std::shared_ptr<CommProgress> progress);
  void unregister_comm(uint64_t id);
  // Note [Gloo peer monitor]: asks every other member where it is on
  // communicator `id` and describes those not at `sequence`.
  std::string diagnose(uint64_t id, uint64_t sequence, const std::vector<int>& members,
                       std::chrono::milliseconds reply_timeout);

 private:
  void respond_loop();

  std::shared_ptr<KeyValueStore> store_;
  int rank_, size_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::vector<std::string> hosts_;
  std::shared_ptr<gloo::transport::Context> monitor_;
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<CommProgress>> comms_;
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

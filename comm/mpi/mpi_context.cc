#include "comm/mpi/mpi_context.h"

#include <cstring>
#include <sstream>

#include "comm/mpi/mpi_error.h"
#include "comm/mpi/mpi_wait.h"
#include "comm/peer_report.h"
#include "core/error.h"
#include "core/parallel.h"

namespace mp {
namespace {

constexpr int kQueryTag = 7001;
constexpr int kReplyTag = 7002;

}  // namespace

std::vector<std::string> gather_processor_names(MPI_Comm comm) {
  int size = 0, len = 0;
  MP_CHECK_MPI(MPI_Comm_size(comm, &size));
  char mine[MPI_MAX_PROCESSOR_NAME] = {};
  MP_CHECK_MPI(MPI_Get_processor_name(mine, &len));
  std::vector<char> all(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Request req;
  MP_CHECK_MPI(MPI_Iallgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                              comm, &req));
  mpi_wait(&req);
  std::vector<std::string> hosts(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const char* name = all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    hosts[static_cast<size_t>(r)].assign(name, strnlen(name, MPI_MAX_PROCESSOR_NAME));
  }
  return hosts;
}

MpiContext::MpiContext() {
  MP_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
  MP_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &side_));
  MP_CHECK_MPI(MPI_Comm_set_errhandler(side_, MPI_ERRORS_RETURN));
  hosts_ = gather_processor_names(side_);
  responder_ = std::thread([this] {
    name_this_thread("mpi-respond");
    respond_loop();
  });
}

MpiContext::~MpiContext() {
  stop_ = true;
  responder_.join();
  MPI_Comm_free(&side_);
}

// Query: {comm id, nonce}. Reply: {nonce, known (0/1), issued, started}.
void MpiContext::respond_loop() {
  uint64_t query[2] = {};
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Irecv(query, 2, MPI_UINT64_T, MPI_ANY_SOURCE, kQueryTag, side_, &req);
  while (!stop_.load()) {
    int arrived = 0;
    MPI_Status status;
    MPI_Test(&req, &arrived, &status);
    if (!arrived) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    uint64_t reply[4] = {query[1], 0, 0, 0};
    progress_of(query[0], reply + 1);
    // Four words go eagerly: this does not wait for the asker.
    MPI_Send(reply, 4, MPI_UINT64_T, status.MPI_SOURCE, kReplyTag, side_);
    MPI_Irecv(query, 2, MPI_UINT64_T, MPI_ANY_SOURCE, kQueryTag, side_, &req);
  }
  MPI_Cancel(&req);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
}

std::string MpiContext::diagnose(uint64_t id, uint64_t sequence, const std::vector<int>& members,
                                 std::chrono::milliseconds reply_timeout) {
  std::lock_guard<std::mutex> lock(diagnose_mu_);
  const uint64_t nonce = ++nonce_ | (static_cast<uint64_t>(world_rank_) << 40);
  struct Peer {
    int member;  // rank in the communicator
    int world;   // rank in the side channel
    uint64_t reply[4] = {};
    MPI_Request req = MPI_REQUEST_NULL;
    bool answered = false;
  };
  std::vector<Peer> peers;
  for (int m = 0; m < static_cast<int>(members.size()); ++m) {
    if (members[m] != world_rank_) peers.push_back(Peer{m, members[m]});
  }
  const uint64_t query[2] = {id, nonce};
  for (Peer& p : peers) {
    MP_CHECK_MPI(MPI_Irecv(p.reply, 4, MPI_UINT64_T, p.world, kReplyTag, side_, &p.req));
    MP_CHECK_MPI(MPI_Send(query, 2, MPI_UINT64_T, p.world, kQueryTag, side_));
  }
  const auto deadline = std::chrono::steady_clock::now() + reply_timeout;
  size_t pending = peers.size();
  while (pending > 0 && std::chrono::steady_clock::now() < deadline) {
    for (Peer& p : peers) {
      if (p.answered) continue;
      int done = 0;
      MP_CHECK_MPI(MPI_Test(&p.req, &done, MPI_STATUS_IGNORE));
      if (!done) continue;
      if (p.reply[0] != nonce) {  // a late answer to an earlier diagnosis
        MP_CHECK_MPI(MPI_Irecv(p.reply, 4, MPI_UINT64_T, p.world, kReplyTag, side_, &p.req));
        continue;
      }
      p.answered = true;
      --pending;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<comm_detail::PeerAnswer> answers;
  for (Peer& p : peers) {
    if (!p.answered) {
      MPI_Cancel(&p.req);
      MPI_Wait(&p.req, MPI_STATUS_IGNORE);
    }
    answers.push_back({p.member, host_of(p.world), p.answered, p.reply[1] != 0, p.reply[2], p.reply[3]});
  }
  return comm_detail::describe_peers(answers, sequence, host_of(world_rank_), reply_timeout, "MPI");
}

}  // namespace mp

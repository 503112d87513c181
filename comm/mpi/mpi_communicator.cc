#include "comm/mpi/mpi_communicator.h"

#include <algorithm>
#include <array>
#include <climits>

#include "comm/backend_util.h"
#include "comm/host_rounds.h"
#include "comm/mpi/mpi_error.h"
#include "comm/mpi/mpi_wait.h"
#include "core/error.h"

namespace mp {
namespace {

using comm_detail::ChunkSplit;
using comm_detail::reduce_chunks;
using comm_detail::HostRounds;
using comm_detail::mix;
using comm_detail::element_ptr;

constexpr int kChunkTag = 9001;
constexpr int kGatherTag = 9002;
// Large all-reduces and broadcasts go in pieces of at most 16 MiB. MPI
// counts are ints, and Open MPI's temporary buffers for larger messages are
// fresh pages on every call (measured: a 64 MiB fp32 all_reduce faulted
// 8194 pages per call and took 3x as long as four 16 MiB pieces).
constexpr size_t kPieceBytes = size_t{16} << 20;
int64_t piece_elements(DType t) { return static_cast<int64_t>(kPieceBytes / dtype_size(t)); }

// Collectives here only move elements (mp reduces them), so a 16-bit float
// travels as 16 raw bits.
MPI_Datatype datatype(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kBF16:
    case DType::kF16: return MPI_UINT16_T;
    case DType::kF8E4M3:
    case DType::kF8E5M2: return MPI_UINT8_T;
  }
  MP_THROW(EnforceError, "invalid DType ", static_cast<int>(t));
}

int to_int_count(int64_t n, const char* what) {
  MP_ENFORCE(n <= INT_MAX, what, ": ", n, " elements per rank exceed MPI's int count (", INT_MAX, ")");
  return static_cast<int>(n);
}

}  // namespace

std::unique_ptr<MpiCommunicator> MpiCommunicator::create_world(const std::string& name,
                                                               CommOptions options) {
  auto ctx = std::make_shared<MpiContext>();
  MPI_Comm comm = MPI_COMM_NULL;
  MP_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  return std::unique_ptr<MpiCommunicator>(
      new MpiCommunicator(std::move(ctx), comm, mix(0x6d70, 1), name, options));
}

MpiCommunicator::MpiCommunicator(std::shared_ptr<MpiContext> ctx, MPI_Comm comm, uint64_t id,
                                 std::string name, CommOptions options)
    : HostCommunicator(std::move(name), options, id, ctx), ctx_(std::move(ctx)), comm_(comm) {
  MP_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  MP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MP_CHECK_MPI(MPI_Comm_group(comm_, &group));
  MP_CHECK_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> members(size_);
  for (int i = 0; i < size_; ++i) members[i] = i;
  members_.resize(size_);
  MP_CHECK_MPI(MPI_Group_translate_ranks(group, size_, members.data(), world, members_.data()));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  ctx_->register_comm(id_, progress_);
}

MpiCommunicator::~MpiCommunicator() {
  if (cpu_streams_abandoned()) {  // a collective timed out: it may never return
    ctx_->unregister_comm(id_);
    return;                       // comm_ stays allocated for the stuck thread
  }
  try {
    stream_.synchronize();  // no collective may still use comm_ when it is freed
  } catch (...) {
    // The failure was reported through the Work that carried it.
  }
  ctx_->unregister_comm(id_);
  MPI_Comm_free(&comm_);
}

void MpiCommunicator::gather_fingerprints(const CollectiveInfo&, const std::array<int64_t, 4>& mine,
                                          std::vector<int64_t>& all) {
  MPI_Request req;
  MP_CHECK_MPI(MPI_Iallgather(mine.data(), 4, MPI_INT64_T, all.data(), 4, MPI_INT64_T, comm_, &req));
  mpi_wait(&req);
}

// Note [Ring all-gather]: N - 1 rounds; in round s each rank sends to its
// right neighbour the chunk it got in round s - 1 (its own in round 0) and
// receives from its left one the chunk of rank r - s - 1. Each rank's link
// carries (N - 1)/N of the buffer each way, as before, but as one stream
// to one peer at a time: with every rank sending to every other at once,
// N - 1 streams met at each receiver's link and shared it unevenly (4
// hosts at 1 Gbit/s: 0.65-0.80 of the link).
void MpiCommunicator::gather_ring(const CollectiveInfo&, const void* mine, const Tensor& output,
                                  const ChunkSplit& split) {
  const MPI_Datatype type = datatype(output.dtype());
  const int64_t piece = piece_elements(output.dtype());
  const size_t elem = dtype_size(output.dtype());
  const size_t own = static_cast<size_t>(rank_);
  char* slot = element_ptr(output, split.offsets[own]);
  std::vector<MPI_Request> reqs;
  auto copy_own = [&] {  // Note [Progress while copying]: the transfers of `reqs` go on
    if (mine != slot && split.counts[own] > 0) {
      mpi_copy_progressing(slot, mine, static_cast<size_t>(split.counts[own]) * elem, static_cast<int>(reqs.size()),
                           reqs.data());
    }
  };
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  for (int s = 0; s + 1 < size_; ++s) {
    const auto send = static_cast<size_t>((rank_ - s + size_) % size_);
    const auto recv = static_cast<size_t>((rank_ - s - 1 + 2 * size_) % size_);
    reqs.clear();
    for (int64_t b = 0; b < split.counts[recv]; b += piece) {
      reqs.emplace_back();
      MP_CHECK_MPI(MPI_Irecv(element_ptr(output, split.offsets[recv] + b),
                             static_cast<int>(std::min(piece, split.counts[recv] - b)), type, left, kGatherTag,
                             comm_, &reqs.back()));
    }
    // Round 0 sends this rank's chunk from where it is, and copies it into
    // its slot of the output while the transfers run (and progress).
    const char* from = s == 0 ? static_cast<const char*>(mine) : element_ptr(output, split.offsets[send]);
    for (int64_t b = 0; b < split.counts[send]; b += piece) {
      reqs.emplace_back();
      MP_CHECK_MPI(MPI_Isend(from + b * static_cast<int64_t>(elem),
                             static_cast<int>(std::min(piece, split.counts[send] - b)), type, right, kGatherTag,
                             comm_, &reqs.back()));
    }
    if (s == 0) copy_own();
    mpi_wait_all(static_cast<int>(reqs.size()), reqs.data());
  }
  if (size_ == 1) copy_own();  // no rounds
}

namespace {

// The MPI transport of Note [Chunked reduction]: nonblocking sends and
// receives of a round, all posted before any is waited for, two rounds in
// flight (comm/host_rounds.h: an in-place all-reduce writes `out` over this
// rank's part of its input, read in place: the accumulation reads every
// element before it writes it, kernels/cpu/reduce.h, and the sends in
// flight read other chunks).
class MpiRounds final : public HostRounds {
 public:
  MpiRounds(MPI_Comm comm, MPI_Datatype type, int rank, int size, const Tensor& input, const Tensor& scratch,
            const Tensor& out, math::ElementOp op, double divisor, bool wire)
      : HostRounds(rank, size, input, scratch, out, op, divisor, wire), comm_(comm), type_(type) {
    for (auto& r : reqs_) r.reserve(2 * static_cast<size_t>(size));
  }

  void start(const ChunkSplit& split, int64_t begin, int64_t piece, int64_t recv, int slot) override {
    std::vector<MPI_Request>& reqs = reqs_[slot];
    reqs.clear();
    for (int j = 0; j < size_; ++j) {
      char* dst = place(split, begin, piece, slot, j);
      if (j == rank_) continue;
      const int64_t send = std::clamp<int64_t>(split.counts[static_cast<size_t>(j)] - begin, 0, piece);
      if (recv > 0) {
        reqs.emplace_back();
        MP_CHECK_MPI(MPI_Irecv(dst, static_cast<int>(recv), type_, j, kChunkTag, comm_, &reqs.back()));
      }
      if (send > 0) {
        reqs.emplace_back();
        MP_CHECK_MPI(MPI_Isend(outgoing(split, begin, j), static_cast<int>(send), type_, j, kChunkTag, comm_,
                               &reqs.back()));
      }
    }
  }

  void finish(int slot) override { mpi_wait_all(static_cast<int>(reqs_[slot].size()), reqs_[slot].data()); }

 private:
  MPI_Comm comm_;
  MPI_Datatype type_;
  std::vector<MPI_Request> reqs_[2];
};

}  // namespace

void MpiCommunicator::accumulate_chunks(const CollectiveInfo&, const Tensor& input, const ChunkSplit& split,
                                        const Tensor& out, math::ElementOp op, double divisor, bool wire) {
  if (split.longest() == 0) return;
  const int64_t piece =
      comm_detail::host_round_piece(options().accumulate_chunk_bytes, input, size_, allocator_, &scratch_);
  MpiRounds rounds(comm_, datatype(input.dtype()), rank_, size_, input, scratch_, out, op, divisor, wire);
  reduce_chunks(rounds, split, rank_, piece);
}

WorkPtr MpiCommunicator::do_broadcast(const Tensor& tensor, int root) {
  return issue({"broadcast", 0, tensor.dtype(), tensor.numel()}, [=, this](const CollectiveInfo&) {
    const MPI_Datatype type = datatype(tensor.dtype());
    const int64_t piece = piece_elements(tensor.dtype());
    for (int64_t begin = 0; begin < tensor.numel(); begin += piece) {
      const int count = static_cast<int>(std::min(piece, tensor.numel() - begin));
      MPI_Request req;
      MP_CHECK_MPI(MPI_Ibcast(element_ptr(tensor, begin), count, type, root, comm_, &req));
      mpi_wait(&req);
    }
  });
}

WorkPtr MpiCommunicator::do_all_to_all(const Tensor& input, const Tensor& output, bool in_place) {
  const int64_t n = input.numel() / size_;
  const int count = to_int_count(n, "all_to_all");
  return issue({"all_to_all", 0, input.dtype(), n}, [=, this](const CollectiveInfo&) {
    const MPI_Datatype type = datatype(input.dtype());
    MPI_Request req;
    MP_CHECK_MPI(MPI_Ialltoall(in_place ? MPI_IN_PLACE : input.data(), count, type, output.data(), count, type,
                               comm_, &req));
    mpi_wait(&req);
  });
}

// The counts differ between ranks, so the fingerprint's count is 0 (the
// description says how many this rank sends).
WorkPtr MpiCommunicator::do_all_to_all_v(const Tensor& input, const std::vector<int64_t>& send_counts,
                                         const Tensor& output, const std::vector<int64_t>& recv_counts) {
  std::vector<int> sc(static_cast<size_t>(size_)), sd(sc.size()), rc(sc.size()), rd(sc.size());
  int64_t s_at = 0, r_at = 0;
  for (size_t j = 0; j < sc.size(); ++j) {
    sd[j] = to_int_count(s_at, "all_to_all_v");
    sc[j] = to_int_count(send_counts[j], "all_to_all_v");
    rd[j] = to_int_count(r_at, "all_to_all_v");
    rc[j] = to_int_count(recv_counts[j], "all_to_all_v");
    s_at += send_counts[j];
    r_at += recv_counts[j];
  }
  return issue({"all_to_all_v", 0, input.dtype(), 0}, [=, this](const CollectiveInfo&) {
    const MPI_Datatype type = datatype(input.dtype());
    MPI_Request req;
    MP_CHECK_MPI(MPI_Ialltoallv(input.data(), sc.data(), sd.data(), type, output.data(), rc.data(), rd.data(), type,
                                comm_, &req));
    mpi_wait(&req);
  });
}

void MpiCommunicator::do_host_all_gather(const void* mine, size_t bytes, void* all) {
  MP_ENFORCE_LE(bytes, static_cast<size_t>(INT_MAX), "host_all_gather of ", bytes, " bytes per rank");
  const int count = static_cast<int>(bytes);
  // The host values are waited for before this returns, so the body may
  // borrow the caller's buffers.
  issue({"host_all_gather", 0, DType::kF32, static_cast<int64_t>(bytes)}, [=, this](const CollectiveInfo&) {
    MPI_Request req;
    MP_CHECK_MPI(MPI_Iallgather(mine, count, MPI_BYTE, all, count, MPI_BYTE, comm_, &req));
    mpi_wait(&req);
  })->wait();
}

WorkPtr MpiCommunicator::barrier() {
  return issue({"barrier", 0, DType::kF32, 0}, [this](const CollectiveInfo&) {
    MPI_Request req;
    MP_CHECK_MPI(MPI_Ibarrier(comm_, &req));
    mpi_wait(&req);
  });
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name) {
  auto child = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  issue({"split", 0, DType::kF32, 0}, [this, child, color, key](const CollectiveInfo&) {
    MP_CHECK_MPI(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, child.get()));
  })->wait();
  const uint64_t id = child_id(color);
  if (*child == MPI_COMM_NULL) return nullptr;
  return std::unique_ptr<Communicator>(new MpiCommunicator(ctx_, *child, id, name, options()));
}

}  // namespace mp

#include "comm/nccl/nccl_communicator.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "comm/backend_util.h"
#include "comm/nccl/nccl_error.h"
#include "comm/nccl/nccl_state.h"
#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/convert.h"
#include "kernels/cuda/reduce_cuda.h"

namespace mp {

namespace {

using comm_detail::ChunkSplit;
using comm_detail::ceil_chunks;
using comm_detail::element_op;
using comm_detail::equal_chunks;
using comm_detail::reduce_chunks;
using comm_detail::RoundTransport;
using comm_detail::element_ptr;
using comm_detail::reduction_divisor;

static_assert(ncclFloat8e4m3 == 10 && ncclFloat8e5m2 == 11, "NCCL 2.24+ with fp8 types is required");

// The NCCL type of a dtype, for reductions (fp8 is rejected before this).
ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kF8E4M3: return ncclFloat8e4m3;
    case DType::kF8E5M2: return ncclFloat8e5m2;
  }
  MP_THROW(EnforceError, "invalid DType ", static_cast<int>(t));
}

// The type data moves as in copies (all_gather, broadcast, all_to_all,
// send/recv). fp8 moves as bytes: identical bits, and NCCL 2.27+ is reported
// to refuse its fp8 types below sm_90 even for gathers, while this build
// targets sm_80 too.
ncclDataType_t nccl_copy_type(DType t) { return is_fp8(t) ? ncclUint8 : nccl_type(t); }

char* byte_ptr(const Buffer& b, size_t offset_bytes) { return static_cast<char*>(b.data()) + offset_bytes; }

size_t count_of(int64_t n) { return static_cast<size_t>(n); }

}  // namespace

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(std::unique_ptr<Communicator> host, Device device,
                                                           const std::string& name, CommOptions options) {
  MP_ENFORCE(device.is_cuda(), "the NCCL communicator '", name, "' needs a CUDA device, got ", device);
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(std::move(host), device, name, options));
  c->init_nccl();  // on failure the destructor frees what was made
  return c;
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> host, Device device, std::string name,
                                   CommOptions options)
    : Communicator(std::move(name), options),
      host_(std::move(host)),
      device_(device),
      rank_(host_->rank()),
      size_(host_->size()),
      state_(std::make_shared<NcclState>(this->name(), options.timeout, options.diagnose_timeout)),
      allocator_(device),
      stream_(device, "nccl:" + this->name(), options.timeout) {  // bounded host waits (core/host_wait.h)
  state_->set_peers(host_->watch(state_->progress_ptr()));
}

void NcclCommunicator::init_nccl() {
  CudaDeviceGuard guard(device_);
  struct IdMessage {
    ncclUniqueId id;
    int32_t result;
  } msg{};
  if (rank_ == 0) msg.result = ncclGetUniqueId(&msg.id);
  // Everyone learns whether rank 0 got an id, so no rank waits in init alone.
  const std::string got = host_->broadcast_bytes({reinterpret_cast<const char*>(&msg), sizeof msg}, 0);
  MP_ENFORCE_EQ(got.size(), sizeof msg, "the NCCL unique id message from rank 0");
  std::memcpy(&msg, got.data(), sizeof msg);
  if (msg.result != ncclSuccess) {
    MP_THROW(CommError, "rank 0 of communicator '", name(), "' could not create an NCCL unique id: ",
             ncclGetErrorString(static_cast<ncclResult_t>(msg.result)));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; we poll ncclCommGetAsyncError
  config.commName = name().c_str();
  std::lock_guard<std::timed_mutex> lock(state_->mutex());
  const ncclResult_t rc = ncclCommInitRankConfig(state_->comm_slot(), size_, msg.id, rank_, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    state_->abort_locked("initialization failed");
    MP_CHECK_NCCL(rc);
  }
  state_->wait_ready_locked(detail::str("NCCL initialization (", size_, " ranks, ", device_, ")"));
}

NcclCommunicator::~NcclCommunicator() {
  try {
    CudaDeviceGuard guard(device_);
    bool drained = false;
    try {
      drained = stream_.record().wait_for(options().timeout);
    } catch (const Error&) {
      // A CUDA error; the Work that carried it reported it.
    }
    std::lock_guard<std::timed_mutex> lock(state_->mutex());
    state_->close_locked(drained);
  } catch (...) {
    // Destructors do not throw; there is nothing left to clean up on error.
  }
}

bool NcclCommunicator::aborted() const {
  std::lock_guard<std::timed_mutex> lock(state_->mutex());
  return state_->aborted_locked();
}

void NcclCommunicator::abort_communicator(const std::string& reason) {
  std::lock_guard<std::timed_mutex> lock(state_->mutex());
  state_->abort_locked(reason);
}

Work::Diagnose NcclCommunicator::diagnoser() const {
  return [state = state_](const CollectiveInfo& info) { return state->diagnose(info); };
}

void NcclCommunicator::number(CollectiveInfo& info) {
  {
    std::lock_guard<std::timed_mutex> lock(state_->mutex());
    state_->throw_if_aborted_locked();
  }
  info.sequence = state_->progress().issued.load() + 1;
  state_->progress().issued.store(info.sequence);
  if (options().check_fingerprints) check_fingerprint(info);
}

template <class F>
auto NcclCommunicator::on_host(const CollectiveInfo& info, F&& exchange) {
  try {
    return exchange();
  } catch (...) {
    abort_communicator(info.describe() + " failed on the host communicator");
    throw;
  }
}

WorkPtr NcclCommunicator::issue(CollectiveInfo info, const std::function<void()>& enqueue) {
  NcclState& s = *state_;
  number(info);
  CudaDeviceGuard guard(device_);
  std::lock_guard<std::timed_mutex> lock(s.mutex());
  s.throw_if_aborted_locked();
  s.wait_ready_locked("the state check before " + info.describe());  // async errors
  try {
    enqueue();
  } catch (const CommError&) {
    throw;  // wait_ready_locked has aborted already
  } catch (...) {
    // This rank is now out of step with the others: refuse further use.
    s.abort_locked("issuing " + info.describe() + " failed");
    throw;
  }
  s.progress().started.store(info.sequence);
  Event done = stream_.record();
  s.track_locked(info.sequence, done);
  return std::make_shared<Work>(info, std::move(done), name(), options().timeout, diagnoser());
}

void NcclCommunicator::check_fingerprint(const CollectiveInfo& info) {
  const std::array<int64_t, 4> mine = comm_detail::fingerprint(info);
  on_host(info, [&] { comm_detail::check_fingerprints(mine, host_->all_gather_int64(mine), name(), info.sequence); });
}

size_t NcclCommunicator::ensure_scratch() {
  if (scratch_.data() == nullptr) {
    // At least one element of the widest dtype per rank, so a round moves something.
    const size_t bytes = std::max(options().accumulate_chunk_bytes, 4 * static_cast<size_t>(size_));
    scratch_ = allocator_.allocate(bytes, MemCategory::kCommScratch);
  }
  return scratch_.size_bytes();
}

void NcclCommunicator::post_divide(const Tensor& output, double divisor) {
  if (divisor != 1.0) convert(output, output, ConvertOptions{.divisor = divisor}, &stream_);
}

WorkPtr NcclCommunicator::do_all_gather(const Tensor& input, const Tensor& output, bool /*in_place*/) {
  const int64_t n = input.numel();
  // In place when input is output's rank slice: NCCL's convention too.
  return issue({"all_gather", 0, input.dtype(), n}, [&] {
    if (n == 0) return;
    MP_NCCL_ENQUEUE(*state_, ncclAllGather(input.data(), output.data(), count_of(n),
                                            nccl_copy_type(input.dtype()), state_->comm(), stream_.handle()));
  });
}

WorkPtr NcclCommunicator::do_reduce_scatter(const Tensor& input, const Tensor& output, const ReduceOptions& o,
                                            bool /*in_place*/) {
  const int64_t n = output.numel();
  const double divisor = reduction_divisor(o, size_);
  const math::ElementOp op = element_op(o.op);
  if (o.accumulate == ReduceAccumulate::kFp32 || op != math::ElementOp::kSum) {
    const ChunkSplit split = equal_chunks(size_, n);
    return issue({"reduce_scatter", 0, input.dtype(), n},
                 [&] { accumulate_chunks(input, split, output, op, divisor); });
  }
  return issue({"reduce_scatter", 0, input.dtype(), n}, [&] {
    if (n == 0) return;
    MP_NCCL_ENQUEUE(*state_, ncclReduceScatter(input.data(), output.data(), count_of(n),
                                                nccl_type(input.dtype()), ncclSum, state_->comm(),
                                                stream_.handle()));
    post_divide(output, divisor);
  });
}

WorkPtr NcclCommunicator::do_all_reduce(const Tensor& input, const Tensor& output, const ReduceOptions& o,
                                        bool /*in_place*/) {
  const double divisor = reduction_divisor(o, size_);
  const math::ElementOp op = element_op(o.op);
  const int64_t n = input.numel();
  if (o.accumulate == ReduceAccumulate::kWire && op == math::ElementOp::kSum) {
    return issue({"all_reduce", 0, input.dtype(), n}, [&] {
      if (n == 0) return;
      MP_NCCL_ENQUEUE(*state_, ncclAllReduce(input.data(), output.data(), count_of(n),
                                              nccl_type(input.dtype()), ncclSum, state_->comm(),
                                              stream_.handle()));
      post_divide(output, divisor);
    });
  }
  // Rank j reduces chunk j (Note [Chunked reduction]), then every rank
  // gathers every chunk.
  const ChunkSplit split = ceil_chunks(size_, n);
  return issue({"all_reduce", 0, input.dtype(), n}, [&] {
    accumulate_chunks(input, split, output.flat(split.offsets[rank_], split.counts[rank_]), op, divisor);
    gather_chunks(output, split);
  });
}

namespace {

// The NCCL transport of Note [Chunked reduction]: a round's sends and
// receives in one NCCL group on the communicator's stream, this rank's own
// part copied into its slot of the scratch beside them; the accumulating
// kernel follows on the same stream.
class NcclRounds final : public RoundTransport {
 public:
  NcclRounds(NcclState& state, cudaStream_t stream, int rank, int size, const Tensor& input, void* scratch,
             const Tensor& out, math::ElementOp op, double divisor)
      : state_(state), stream_(stream), rank_(rank), size_(size), input_(input), scratch_(static_cast<char*>(scratch)),
        out_(out), op_(op), divisor_(divisor), type_(nccl_type(input.dtype())), elem_(dtype_size(input.dtype())) {}

  int slots() const override { return 1; }  // the stream orders the rounds

  void start(const ChunkSplit& split, int64_t begin, int64_t piece, int64_t recv, int /*slot*/) override {
    if (recv > 0) {  // our own contribution, slot rank_
      MP_CHECK_CUDA(cudaMemcpyAsync(slot(rank_, piece), element_ptr(input_, split.offsets[rank_] + begin),
                                    count_of(recv) * elem_, cudaMemcpyDeviceToDevice, stream_));
    }
    if (size_ == 1) return;
    NcclGroup group;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      const int64_t send = std::clamp<int64_t>(split.counts[j] - begin, 0, piece);
      if (recv > 0) MP_CHECK_NCCL(ncclRecv(slot(j, piece), count_of(recv), type_, j, state_.comm(), stream_));
      if (send > 0) {
        MP_CHECK_NCCL(ncclSend(element_ptr(input_, split.offsets[j] + begin), count_of(send), type_, j,
                               state_.comm(), stream_));
      }
    }
    MP_NCCL_ENQUEUE(state_, group.end());
  }

  void finish(int /*slot*/) override {}

  void accumulate(int64_t begin, int64_t piece, int64_t recv, int /*slot*/) override {
    accumulate_rank_chunks_cuda(scratch_, input_.dtype(), size_, piece, recv, element_ptr(out_, begin), out_.dtype(),
                                op_, divisor_, stream_);
  }

 private:
  char* slot(int j, int64_t piece) const { return scratch_ + static_cast<size_t>(j * piece) * elem_; }

  NcclState& state_;
  cudaStream_t stream_;
  int rank_, size_;
  Tensor input_;
  char* scratch_;
  Tensor out_;
  math::ElementOp op_;
  double divisor_;
  ncclDataType_t type_;
  size_t elem_;
};

}  // namespace

void NcclCommunicator::accumulate_chunks(const Tensor& input, const ChunkSplit& split, const Tensor& out,
                                         math::ElementOp op, double divisor) {
  if (split.longest() == 0) return;
  const size_t elem = dtype_size(input.dtype());
  const int64_t piece = static_cast<int64_t>(ensure_scratch() / (elem * static_cast<size_t>(size_)));
  NcclRounds rounds(*state_, stream_.handle(), rank_, size_, input, scratch_.data(), out, op, divisor);
  reduce_chunks(rounds, split, rank_, piece);
}

void NcclCommunicator::gather_chunks(const Tensor& output, const ChunkSplit& split) {
  if (size_ == 1 || output.numel() == 0) return;
  const std::vector<int64_t>& offsets = split.offsets;
  const std::vector<int64_t>& counts = split.counts;
  const ncclDataType_t type = nccl_copy_type(output.dtype());
  const int64_t chunk = counts[0];  // the first chunk is the longest
  if (chunk * size_ == output.numel()) {  // equal chunks: a ring all-gather, in place
    MP_NCCL_ENQUEUE(*state_, ncclAllGather(element_ptr(output, offsets[rank_]), output.data(), count_of(chunk),
                                            type, state_->comm(), stream_.handle()));
    return;
  }
  // Unequal chunks: every rank sends its chunk to every other, straight
  // between the outputs; no padding, no scratch.
  NcclGroup group;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    if (counts[rank_] > 0) {
      MP_CHECK_NCCL(ncclSend(element_ptr(output, offsets[rank_]), count_of(counts[rank_]), type, j,
                             state_->comm(), stream_.handle()));
    }
    if (counts[j] > 0) {
      MP_CHECK_NCCL(ncclRecv(element_ptr(output, offsets[j]), count_of(counts[j]), type, j, state_->comm(),
                             stream_.handle()));
    }
  }
  MP_NCCL_ENQUEUE(*state_, group.end());
}

WorkPtr NcclCommunicator::do_broadcast(const Tensor& tensor, int root) {
  const int64_t n = tensor.numel();
  return issue({"broadcast", 0, tensor.dtype(), n}, [&] {
    if (n == 0) return;
    MP_NCCL_ENQUEUE(*state_, ncclBroadcast(tensor.data(), tensor.data(), count_of(n),
                                            nccl_copy_type(tensor.dtype()), root, state_->comm(),
                                            stream_.handle()));
  });
}

WorkPtr NcclCommunicator::do_all_to_all(const Tensor& input, const Tensor& output, bool in_place) {
  const int64_t n = input.numel() / size_;
  return issue({"all_to_all", 0, input.dtype(), n}, [&] {
    if (n == 0) return;
    if (in_place) return all_to_all_in_place(output, n);
    const std::vector<int64_t> counts(static_cast<size_t>(size_), n);
    send_chunks(input, counts, output, counts);
  });
}

WorkPtr NcclCommunicator::do_all_to_all_v(const Tensor& input, const std::vector<int64_t>& send_counts,
                                          const Tensor& output, const std::vector<int64_t>& recv_counts) {
  return issue({"all_to_all_v", 0, input.dtype(), 0}, [&] { send_chunks(input, send_counts, output, recv_counts); });
}

void NcclCommunicator::send_chunks(const Tensor& input, const std::vector<int64_t>& send_counts, const Tensor& output,
                                   const std::vector<int64_t>& recv_counts) {
  const size_t elem = dtype_size(input.dtype());
  const ncclDataType_t type = nccl_copy_type(input.dtype());
  std::vector<int64_t> s_at(static_cast<size_t>(size_) + 1, 0), r_at(s_at.size(), 0);
  for (size_t j = 0; j < send_counts.size(); ++j) {
    s_at[j + 1] = s_at[j] + send_counts[j];
    r_at[j + 1] = r_at[j] + recv_counts[j];
  }
  const size_t me = static_cast<size_t>(rank_);
  if (send_counts[me] > 0) {
    MP_CHECK_CUDA(cudaMemcpyAsync(element_ptr(output, r_at[me]), element_ptr(input, s_at[me]),
                                  count_of(send_counts[me]) * elem, cudaMemcpyDeviceToDevice, stream_.handle()));
  }
  if (size_ == 1) return;
  NcclGroup group;
  for (int j = 0; j < size_; ++j) {
    const size_t k = static_cast<size_t>(j);
    if (j == rank_) continue;
    if (send_counts[k] > 0) {
      MP_CHECK_NCCL(ncclSend(element_ptr(input, s_at[k]), count_of(send_counts[k]), type, j, state_->comm(),
                             stream_.handle()));
    }
    if (recv_counts[k] > 0) {
      MP_CHECK_NCCL(ncclRecv(element_ptr(output, r_at[k]), count_of(recv_counts[k]), type, j, state_->comm(),
                             stream_.handle()));
    }
  }
  MP_NCCL_ENQUEUE(*state_, group.end());
}

void NcclCommunicator::all_to_all_in_place(const Tensor& tensor, int64_t n) {
  if (size_ == 1) return;  // our own chunk stays where it is
  const size_t elem = dtype_size(tensor.dtype());
  const int64_t piece = static_cast<int64_t>(ensure_scratch() / (elem * static_cast<size_t>(size_)));
  const ncclDataType_t type = nccl_copy_type(tensor.dtype());
  const cudaStream_t stream = stream_.handle();
  // Round by round, stage elements [begin, begin + len) of every other
  // chunk, then receive into exactly those elements: what a round
  // overwrites was staged before, and later rounds read other elements.
  for (int64_t begin = 0; begin < n; begin += piece) {
    const int64_t len = std::min(piece, n - begin);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      MP_CHECK_CUDA(cudaMemcpyAsync(byte_ptr(scratch_, static_cast<size_t>(j * piece) * elem),
                                    element_ptr(tensor, j * n + begin), count_of(len) * elem,
                                    cudaMemcpyDeviceToDevice, stream));
    }
    NcclGroup group;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      MP_CHECK_NCCL(ncclSend(byte_ptr(scratch_, static_cast<size_t>(j * piece) * elem), count_of(len), type, j,
                             state_->comm(), stream));
      MP_CHECK_NCCL(ncclRecv(element_ptr(tensor, j * n + begin), count_of(len), type, j, state_->comm(), stream));
    }
    MP_NCCL_ENQUEUE(*state_, group.end());
  }
}

WorkPtr NcclCommunicator::barrier() {
  if (barrier_buffer_.data() == nullptr) {
    CudaDeviceGuard guard(device_);
    barrier_buffer_ = allocator_.allocate(sizeof(int32_t), MemCategory::kCommScratch);
    MP_CHECK_CUDA(cudaMemsetAsync(barrier_buffer_.data(), 0, sizeof(int32_t), stream_.handle()));
  }
  return issue({"barrier", 0, DType::kF32, 0}, [&] {
    // 0 + 0 + ... stays 0: the value never matters, only that every rank took part.
    MP_NCCL_ENQUEUE(*state_, ncclAllReduce(barrier_buffer_.data(), barrier_buffer_.data(), 1, ncclInt32,
                                            ncclSum, state_->comm(), stream_.handle()));
  });
}

void NcclCommunicator::do_host_all_gather(const void* mine, size_t bytes, void* all) {
  CollectiveInfo info{"host_all_gather", 0, DType::kF32, static_cast<int64_t>(bytes)};
  number(info);
  // Host memory over the host communicator, never the GPU stream (Note
  // [Control plane]): as int64 words, one exchange.
  std::vector<int64_t> words((bytes + 7) / 8, 0);
  std::memcpy(words.data(), mine, bytes);
  const std::vector<int64_t> got = on_host(info, [&] { return host_->all_gather_int64(words); });
  for (size_t r = 0; r < static_cast<size_t>(size_); ++r) {
    std::memcpy(static_cast<char*>(all) + r * bytes, &got[r * words.size()], bytes);
  }
  state_->progress().started.store(info.sequence);
}

WorkPtr NcclCommunicator::fence(const std::string& what) {
  CollectiveInfo info{what, state_->progress().issued.load(), DType::kF32, 0};
  return std::make_shared<Work>(info, stream_.record(), name(), options().timeout, diagnoser());
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, const std::string& name) {
  CollectiveInfo info{"split", 0, DType::kF32, 0};
  number(info);
  // Host-side only: the parent's GPU work is not waited for. See the header
  // for why the child is a fresh NCCL init rather than ncclCommSplit.
  std::unique_ptr<Communicator> host = on_host(info, [&] { return host_->split(color, key, name + " (host)"); });
  state_->progress().started.store(info.sequence);
  if (host == nullptr) return nullptr;
  return create(std::move(host), device_, name, options());
}

}  // namespace mp

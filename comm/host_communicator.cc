#include "comm/host_communicator.h"

#include "comm/backend_util.h"
#include "kernels/convert.h"

namespace mp {

using comm_detail::ChunkSplit;

HostCommunicator::HostCommunicator(std::string name, CommOptions options, uint64_t id,
                                   std::shared_ptr<PeerMonitor> monitor)
    : Communicator(std::move(name), options),
      id_(id),
      monitor_(std::move(monitor)),
      progress_(std::make_shared<CommProgress>()),
      stream_("comm:" + this->name(), StreamOptions{.inherits_failures = false}) {}

WorkPtr HostCommunicator::issue(CollectiveInfo info, std::function<void(const CollectiveInfo&)> body) {
  info.sequence = progress_->issued.load() + 1;
  progress_->issued.store(info.sequence);
  stream_.submit([this, info, body = std::move(body)] {
    progress_->started.store(info.sequence);
    if (options().check_fingerprints) {
      const std::array<int64_t, 4> mine = comm_detail::fingerprint(info);
      std::vector<int64_t> all(4 * static_cast<size_t>(size_));
      gather_fingerprints(info, mine, all);
      comm_detail::check_fingerprints(mine, all, name(), info.sequence);
    }
    body(info);
  });
  return std::make_shared<Work>(info, stream_.record(), name(), options().timeout, diagnoser());
}

WorkPtr HostCommunicator::fence(const std::string& what) {
  CollectiveInfo info{what, progress_->issued.load(), DType::kF32, 0};
  return std::make_shared<Work>(info, stream_.record(), name(), options().timeout, diagnoser());
}

uint64_t HostCommunicator::child_id(int color) {
  return comm_detail::mix(comm_detail::mix(id_, ++splits_), static_cast<uint64_t>(color));
}

Work::Diagnose HostCommunicator::diagnoser() const {
  return [monitor = monitor_, id = id_, members = members_,
          reply = options().diagnose_timeout](const CollectiveInfo& info) {
    return monitor->diagnose(id, info.sequence, members, reply);
  };
}

Work::Diagnose HostCommunicator::watch(std::shared_ptr<CommProgress> progress) {
  const uint64_t id = child_id(-1);
  monitor_->register_comm(id, std::move(progress));
  std::shared_ptr<void> watched(nullptr, [monitor = monitor_, id](void*) { monitor->unregister_comm(id); });
  return [monitor = monitor_, id, members = members_, reply = options().diagnose_timeout,
          watched](const CollectiveInfo& info) { return monitor->diagnose(id, info.sequence, members, reply); };
}

WorkPtr HostCommunicator::do_all_gather(const Tensor& input, const Tensor& output, bool in_place) {
  const int64_t n = input.numel();
  const ChunkSplit split = comm_detail::equal_chunks(size_, n);
  return issue({"all_gather", 0, input.dtype(), n}, [=, this](const CollectiveInfo& info) {
    gather_ring(info, in_place ? comm_detail::element_ptr(output, rank_ * n) : input.data(), output, split);
  });
}

// The wire accumulation by the same chunk exchange, not the transport's own
// reduce-scatter: Open MPI's MPI_Reduce_scatter_block page-faults a fresh
// temporary every call and took 6.5x as long at 64 MiB on 2 ranks (mp_bench
// comm, docs/benchmarks.md); this one also adds in rank order
// (deterministic). `in_place` needs nothing more: the output is this rank's
// own slice, read before it is written.
WorkPtr HostCommunicator::do_reduce_scatter(const Tensor& input, const Tensor& output, const ReduceOptions& o,
                                            bool /*in_place*/) {
  const int64_t n = output.numel();
  const double divisor = comm_detail::reduction_divisor(o, size_);
  const math::ElementOp op = comm_detail::element_op(o.op);
  const bool wire = o.accumulate == ReduceAccumulate::kWire;
  const ChunkSplit split = comm_detail::equal_chunks(size_, n);
  return issue({"reduce_scatter", 0, input.dtype(), n}, [=, this](const CollectiveInfo& info) {
    accumulate_chunks(info, input, split, output, op, wire ? 1.0 : divisor, wire);
    if (wire && divisor != 1.0 && n > 0) convert(output, output, ConvertOptions{.divisor = divisor});
  });
}

WorkPtr HostCommunicator::do_all_reduce(const Tensor& input, const Tensor& output, const ReduceOptions& o,
                                        bool /*in_place: the accumulation reads its own chunk's input first*/) {
  // Rank j reduces chunk j (Note [Chunked reduction]; kWire: in the wire
  // dtype, pairwise in rank order), then the chunks go around the ring
  // (Note [Ring all-gather]): each rank sends 2 (N-1)/N of the buffer, as a
  // ring all-reduce does, every link busy both ways.
  const int64_t n = input.numel();
  const ChunkSplit split = comm_detail::ceil_chunks(size_, n);
  const double divisor = comm_detail::reduction_divisor(o, size_);
  const math::ElementOp op = comm_detail::element_op(o.op);
  const bool wire = o.accumulate == ReduceAccumulate::kWire;
  return issue({"all_reduce", 0, input.dtype(), n}, [=, this](const CollectiveInfo& info) {
    const auto r = static_cast<size_t>(rank_);
    const Tensor mine = output.flat(split.offsets[r], split.counts[r]);
    accumulate_chunks(info, input, split, mine, op, wire ? 1.0 : divisor, wire);
    if (wire && divisor != 1.0 && mine.numel() > 0) convert(mine, mine, ConvertOptions{.divisor = divisor});
    gather_ring(info, mine.numel() > 0 ? mine.data() : output.data(), output, split);
  });
}

}  // namespace mp

// The engine's gradient path (Note [Gradient reduction]).
#include "runtime/grad_reducer.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/convert.h"
#include "kernels/ops.h"

namespace mp {
namespace {
using SC = proto::ShardingConfig;
}

GradReducer::GradReducer(const EngineOptions& o, const FlatLayout& layout, std::vector<UnitState>& units,
                         MeshGroups& mesh, Stream& shard_stream, Stream& replicate_stream, Stream& compute,
                         const Optimizer& opt, CommWatch& comm, Allocator& alloc)
    : o_(o),
      layout_(layout),
      units_(units),
      mesh_(mesh),
      shard_stream_(shard_stream),
      replicate_stream_(replicate_stream),
      compute_(compute),
      opt_(opt),
      comm_(comm) {
  const Precision& p = o.precision;
  if (!o.comm_hook.empty()) hook_ = CommHookRegistry().make(o.comm_hook, alloc);
  auto tensor = [&](DType t, int64_t n, MemCategory c) { return Tensor::zeros(alloc, t, {n}, c); };
  const int64_t p_max = layout.max_padded_numel(), n_max = layout.max_shard_numel();
  local_ = o.local_reduction();
  own_.assign(static_cast<size_t>(layout.num_units()), -1);
  if (!local_) {
    const DType gt = o.grad_buffer_dtype();
    for (int i = 0; i < 2; ++i) grad_in_.push_back(tensor(gt, layout.shared_padded_numel(), MemCategory::kGradient));
    for (int u = 0; u < layout.num_units(); ++u) {
      if (!layout.unit(u).oversized) continue;
      own_[static_cast<size_t>(u)] = static_cast<int>(grad_in_.size());
      grad_in_.push_back(tensor(gt, layout.unit(u).padded_numel, MemCategory::kGradient));
    }
  }
  grad_free_.resize(std::max<size_t>(grad_in_.size(), 2));
  const bool no_shard_cast = o.strategy == SC::NO_SHARD && !o.deterministic && o.comm_hook.empty() &&
                             (p.reduce_dtype != p.grad_accum_dtype || p.loss_scaling != LossScalingMode::kNone);
  if ((o.wire_staging() && !local_) || no_shard_cast) wire_ = tensor(p.reduce_dtype, p_max, MemCategory::kCommScratch);
  if (!o.deterministic && o.sharded_accumulation && o.micro_batches > 1 && !o.full_grad_accumulators()) {
    rs_scratch_ = tensor(o.reduce_out_dtype(), n_max, MemCategory::kCommScratch);
  }
  if (o.deterministic && o.shard_size > 1) recv_ = tensor(DType::kF32, p_max, MemCategory::kCommScratch);
  mean_at_cast_ = o.full_grad_accumulators() && (wire_.defined() || (hook_ && p.loss_scaling != LossScalingMode::kNone));
  if (o.deterministic && o.replicate_size > 1) {
    gathered_ = tensor(DType::kF32, o.replicate_size * p_max, MemCategory::kCommScratch);
  }
  MP_ENFORCE(!local_ || mesh.shard->size() == 1, "local reduction with a shard group of ", mesh.shard->size());
}

double GradReducer::divisor() const {
  const double k = o_.micro_batches;
  const double base = o_.deterministic ? static_cast<double>(o_.world_size) * k : mean_at_cast_ ? 1.0 : k;
  return base * (o_.precision.loss_scaling == LossScalingMode::kStatic ? o_.precision.static_loss_scale : 1.0);
}

double GradReducer::loss_scale_now() const {
  if (o_.precision.loss_scaling == LossScalingMode::kStatic) return o_.precision.static_loss_scale;
  return opt_.loss_scaler() ? opt_.loss_scaler()->scale() : 1.0;
}

Stream& GradReducer::grad_stream() {
  return o_.strategy == SC::NO_SHARD ? replicate_stream_ : shard_stream_;
}

GradBuffer GradReducer::take_buffer(int u, Stream& compute) {
  int index = own_[static_cast<size_t>(u)];
  if (index < 0) {
    index = grad_next_;
    grad_next_ ^= 1;
  }
  comm_.wait_on(compute, grad_free_[index]);
  const UnitLayout& ul = layout_.unit(u);
  std::vector<ops::Range> gaps;
  int64_t at = 0;
  for (const ParamPlacement& p : ul.params) {
    if (p.offset > at) gaps.push_back({at, p.offset});
    at = p.offset + p.numel;
  }
  if (ul.padded_numel > at) gaps.push_back({at, ul.padded_numel});
  // Local: the shard was last read by this stream (the previous update).
  const Tensor& target = local_ ? units_[static_cast<size_t>(u)].grad_shard() : grad_in_[static_cast<size_t>(index)];
  if (!gaps.empty()) ops::zero_ranges(target, gaps, compute);
  return GradBuffer{target.flat(0, ul.padded_numel), local_ ? -1 : index};
}

Stream& GradReducer::reduce(int u, int micro_batch, const GradBuffer& buffer, const Event& computed) {
  // The stream each path below starts on waits for the gradients (the
  // deterministic path reaches the replicate stream through the shard one).
  if (local_) return reduce_local();
  (o_.deterministic ? shard_stream_ : grad_stream()).wait(computed);
  const Tensor g = grad_in_[static_cast<size_t>(buffer.index)].flat(0, units_[static_cast<size_t>(u)].full());
  if (o_.deterministic) return reduce_deterministic(u, micro_batch, g, buffer.index);
  if (o_.full_grad_accumulators()) return reduce_full_accumulator(u, micro_batch, g, buffer.index);
  return reduce_sharded(u, micro_batch, g, buffer.index);
}

// Every rank's fp32 gradient for this shard reaches this rank (all-to-all
// in the shard group, then all-gather across replicas) and is added in fp64
// in global rank order; the last micro-batch rounds once into the shard.
Stream& GradReducer::reduce_deterministic(int u, int micro_batch, const Tensor& g, int index) {
  const UnitState& unit = units_[static_cast<size_t>(u)];
  const int S = o_.shard_size, R = o_.replicate_size;
  Tensor block = g;  // S chunks of n: every group member's contribution to my shard
  if (S > 1) {
    shard_stream_.wait(replicate_done_);  // the replicas are done reading recv
    WorkPtr w = mesh_.shard->all_to_all(g, recv_.flat(0, unit.full()));
    comm_.track(w);
    block = recv_.flat(0, unit.full());
    grad_free_[index] = shard_stream_.record();
  }
  Stream* stream = &shard_stream_;
  Tensor blocks = block;
  if (R > 1) {
    replicate_stream_.wait(shard_stream_.record());
    WorkPtr w = mesh_.replicate->all_gather(block, gathered_.flat(0, R * unit.full()));
    comm_.track(w);
    blocks = gathered_.flat(0, R * unit.full());
    stream = &replicate_stream_;
  }
  const bool first = micro_batch == 0, last = micro_batch == o_.micro_batches - 1;
  const int64_t n = unit.n();
  ops::accumulate_f64(unit.acc64(), unit.grad_shard().device(), blocks, S * R, n, first, *stream);
  if (last) ops::round_f64(unit.acc64(), unit.grad_shard(), n, *stream);
  const Event done = stream->record();
  if (R > 1) replicate_done_ = done;
  if (S == 1) grad_free_[index] = done;
  return *stream;
}

// NO_SHARD, SHARD_OPTIMIZER and UNSHARDED accumulation: full gradients in
// grad_accum_dtype, reduced once after the last micro-batch.
Stream& GradReducer::reduce_full_accumulator(int u, int micro_batch, const Tensor& g, int index) {
  const UnitState& unit = units_[static_cast<size_t>(u)];
  const Precision& p = o_.precision;
  Stream& gs = grad_stream();
  const bool first = micro_batch == 0;
  const DType acc_dtype = unit.acc_full().dtype();
  const int64_t full = unit.full();
  ops::accumulate(unit.acc_full(), g, first, gs);
  grad_free_[index] = gs.record();
  if (micro_batch != o_.micro_batches - 1) return gs;

  // The cast carries the mean over micro-batches, times the loss scale.
  const double cast_divisor = mean_at_cast_ ? o_.micro_batches / loss_scale_now() : 1.0;
  const ReduceOptions ro{ReduceOp::kAvg, 1.0, p.reduce_accumulate};
  if (o_.strategy == SC::NO_SHARD) {
    if (hook_) {
      if (mean_at_cast_) convert(unit.acc_full(), unit.acc_full(), {Rounding::kNearestEven, cast_divisor}, &gs);
      comm_.track(hook_->run(*mesh_.replicate, GradBucket{u, unit.acc_full()}));
    } else {
      Tensor input = unit.acc_full();
      if (wire_.defined()) {
        input = wire_.flat(0, full);
        convert(unit.acc_full(), input, {Rounding::kNearestEven, cast_divisor}, &gs);
      }
      const bool direct = o_.reduce_out_dtype() == acc_dtype;
      comm_.track(mesh_.replicate->all_reduce(input, direct ? unit.acc_full() : input, ro));
      if (!direct) convert(input, unit.acc_full(), {}, &gs);
    }
    return gs;
  }
  Tensor input = unit.acc_full();
  if (o_.wire_staging()) {
    input = wire_.flat(0, full);
    convert(unit.acc_full(), input, {Rounding::kNearestEven, cast_divisor}, &shard_stream_);
  }
  comm_.track(mesh_.shard->reduce_scatter(input, unit.grad_shard(), ro));
  return reduce_across_replicas(u, ro);
}

// The all-reduce across replicas (HYBRID_SHARD: across hosts) of unit u's
// shard after the shard stream's work, through comm.comm_hook when one is
// set; returns the stream the shard is reduced on.
Stream& GradReducer::reduce_across_replicas(int u, const ReduceOptions& ro) {
  if (o_.replicate_size == 1) return shard_stream_;
  const Tensor& shard = units_[static_cast<size_t>(u)].grad_shard();
  replicate_stream_.wait(shard_stream_.record());
  comm_.track(hook_ ? hook_->run(*mesh_.replicate, GradBucket{u, shard})
                    : mesh_.replicate->all_reduce(shard, shard, ro));
  return replicate_stream_;
}

// One rank: nothing to communicate (Note [Gradient reduction]). The
// backward wrote the shard, on the compute stream; any rounding is the
// statistics pass's (local_rounding).
Stream& GradReducer::reduce_local() { return compute_; }

std::optional<ops::RoundThrough> GradReducer::local_rounding() const {
  if (!local_ || !o_.wire_staging()) return std::nullopt;  // an fp32 wire would only copy
  return ops::RoundThrough{o_.precision.reduce_dtype, 1.0 / loss_scale_now()};
}

// SHARDED accumulation (and one micro-batch): reduce-scatter every
// micro-batch; several are added into the shard in grad_accum_dtype.
Stream& GradReducer::reduce_sharded(int u, int micro_batch, const Tensor& g, int index) {
  const UnitState& unit = units_[static_cast<size_t>(u)];
  const Precision& p = o_.precision;
  const ReduceOptions ro{ReduceOp::kAvg, 1.0, p.reduce_accumulate};
  Tensor input = g;
  if (o_.wire_staging()) {
    input = wire_.flat(0, unit.full());
    convert(g, input, {Rounding::kNearestEven, 1.0 / loss_scale_now()}, &shard_stream_);
  }
  const bool single = o_.micro_batches == 1;
  const Tensor out = single ? unit.grad_shard() : rs_scratch_.flat(0, unit.n());
  comm_.track(mesh_.shard->reduce_scatter(input, out, ro));
  grad_free_[index] = shard_stream_.record();
  if (!single) ops::accumulate(unit.grad_shard(), out, micro_batch == 0, shard_stream_);
  return micro_batch == o_.micro_batches - 1 ? reduce_across_replicas(u, ro) : shard_stream_;
}

}  // namespace mp

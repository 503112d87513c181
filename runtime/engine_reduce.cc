// The engine's gradient path: from the fp32 gradients of one unit's
// backward to the reduced shard the update reads (Note [Engine schedule]).
#include <cstring>

#include "kernels/convert.h"
#include "kernels/cpu/accumulate.h"
#include "kernels/cpu/grad_stats.h"
#include "runtime/engine_impl.h"
#include "core/error.h"

namespace mp {
namespace {
using SC = proto::ShardingConfig;
}

CpuStream& Engine::Impl::grad_stream() {
  return o.strategy == SC::NO_SHARD ? *replicate_stream : *shard_stream;
}

// One of the two fp32 gradient buffers, once the communication thread is
// done with its previous contents; alignment gaps and padding zeroed.
Tensor Engine::Impl::take_grad_buffer(int u, int& index) {
  index = grad_next;
  grad_next ^= 1;
  wait(grad_free[index]);
  const UnitLayout& ul = layout.unit(u);
  float* g = grad_in[index].data_as<float>();
  int64_t at = 0;
  for (const ParamPlacement& p : ul.params) {
    if (p.offset > at) std::memset(g + at, 0, static_cast<size_t>(p.offset - at) * 4);
    at = p.offset + p.numel;
  }
  if (ul.padded_numel > at) std::memset(g + at, 0, static_cast<size_t>(ul.padded_numel - at) * 4);
  return grad_in[index].flat(0, ul.padded_numel);
}

void Engine::Impl::reduce_unit(int u, int micro_batch, int index) {
  const Tensor g = grad_in[index].flat(0, units[static_cast<size_t>(u)].full);
  if (o.deterministic) {
    reduce_deterministic(u, micro_batch, g, index);
  } else if (o.full_grad_accumulators()) {
    reduce_full_accumulator(u, micro_batch, g, index);
  } else {
    reduce_sharded(u, micro_batch, g, index);
  }
}

// Every rank's fp32 gradient for this shard reaches this rank (all-to-all
// in the shard group, then all-gather across replicas) and is added in fp64
// in global rank order; the last micro-batch rounds once into the shard.
void Engine::Impl::reduce_deterministic(int u, int micro_batch, const Tensor& g, int index) {
  EngineUnit& unit = units[static_cast<size_t>(u)];
  const int S = o.shard_size, R = o.replicate_size;
  Tensor block = g;  // S chunks of n: every group member's contribution to my shard
  if (S > 1) {
    shard_stream->wait(replicate_done);  // the replicas are done reading recv
    WorkPtr w = mesh.shard->all_to_all(g, recv.flat(0, unit.full));
    maybe_serialize(w);
    block = recv.flat(0, unit.full);
    grad_free[index] = shard_stream->record();
  }
  CpuStream* stream = shard_stream;
  Tensor blocks = block;
  if (R > 1) {
    replicate_stream->wait(shard_stream->record());
    WorkPtr w = mesh.replicate->all_gather(block, gathered.flat(0, R * unit.full));
    maybe_serialize(w);
    blocks = gathered.flat(0, R * unit.full);
    stream = replicate_stream;
  }
  const bool first = micro_batch == 0, last = micro_batch == o.micro_batches - 1;
  auto* acc = static_cast<double*>(unit.acc64.data());
  const int64_t n = unit.n;
  const int count = S * R;
  float* src = blocks.data_as<float>();
  float* out = unit.grad_shard.data_as<float>();
  stream->submit([=] {
    if (first) std::memset(acc, 0, static_cast<size_t>(n) * 8);
    accumulate_f64_cpu(acc, src, count, n, n);
    if (last) round_f64_cpu(acc, out, n);
  });
  const Event done = stream->record();
  if (R > 1) replicate_done = done;
  if (S == 1) grad_free[index] = done;
  after_reduction(u, micro_batch, *stream);
}

// NO_SHARD, SHARD_OPTIMIZER and UNSHARDED accumulation: full gradients in
// grad_accum_dtype, reduced once after the last micro-batch.
void Engine::Impl::reduce_full_accumulator(int u, int micro_batch, const Tensor& g, int index) {
  EngineUnit& unit = units[static_cast<size_t>(u)];
  const Precision& p = o.precision;
  CpuStream& gs = grad_stream();
  const bool first = micro_batch == 0;
  void* acc = unit.acc_full.data();
  const DType acc_dtype = unit.acc_full.dtype();
  const float* src = g.data_as<float>();
  const int64_t full = unit.full;
  gs.submit([=] { accumulate_cpu(acc, acc_dtype, src, DType::kF32, full, first); });
  grad_free[index] = gs.record();
  if (micro_batch != o.micro_batches - 1) return;

  // The cast carries the mean over micro-batches, times the loss scale.
  const double cast_divisor = mean_at_cast ? o.micro_batches / loss_scale_now() : 1.0;
  const ReduceOptions ro{ReduceOp::kAvg, 1.0, p.reduce_accumulate};
  if (o.strategy == SC::NO_SHARD) {
    if (hook) {
      if (mean_at_cast) convert(unit.acc_full, unit.acc_full, {Rounding::kNearestEven, cast_divisor}, &gs);
      maybe_serialize(hook->run(*mesh.replicate, GradBucket{u, unit.acc_full}));
    } else {
      Tensor input = unit.acc_full;
      if (wire.defined()) {
        input = wire.flat(0, full);
        convert(unit.acc_full, input, {Rounding::kNearestEven, cast_divisor}, &gs);
      }
      const bool direct = o.reduce_out_dtype() == acc_dtype;
      maybe_serialize(mesh.replicate->all_reduce(input, direct ? unit.acc_full : input, ro));
      if (!direct) convert(input, unit.acc_full, {}, &gs);
    }
    after_reduction(u, micro_batch, gs);
    return;
  }
  Tensor input = unit.acc_full;
  if (o.wire_staging()) {
    input = wire.flat(0, full);
    convert(unit.acc_full, input, {Rounding::kNearestEven, cast_divisor}, shard_stream);
  }
  maybe_serialize(mesh.shard->reduce_scatter(input, unit.grad_shard, ro));
  if (o.replicate_size > 1) {
    replicate_stream->wait(shard_stream->record());
    maybe_serialize(mesh.replicate->all_reduce(unit.grad_shard, unit.grad_shard, ro));
    after_reduction(u, micro_batch, *replicate_stream);
  } else {
    after_reduction(u, micro_batch, *shard_stream);
  }
}

// SHARDED accumulation (and one micro-batch): reduce-scatter every
// micro-batch; several are added into the shard in grad_accum_dtype.
void Engine::Impl::reduce_sharded(int u, int micro_batch, const Tensor& g, int index) {
  EngineUnit& unit = units[static_cast<size_t>(u)];
  const Precision& p = o.precision;
  const ReduceOptions ro{ReduceOp::kAvg, 1.0, p.reduce_accumulate};
  Tensor input = g;
  if (o.wire_staging()) {
    input = wire.flat(0, unit.full);
    convert(g, input, {Rounding::kNearestEven, 1.0 / loss_scale_now()}, shard_stream);
  }
  const bool single = o.micro_batches == 1;
  const Tensor out = single ? unit.grad_shard : rs_scratch.flat(0, unit.n);
  maybe_serialize(mesh.shard->reduce_scatter(input, out, ro));
  grad_free[index] = shard_stream->record();
  if (!single) {
    void* acc = unit.grad_shard.data();
    const DType acc_dtype = unit.grad_shard.dtype();
    const void* src = out.data();
    const DType src_dtype = out.dtype();
    const int64_t n = unit.n;
    const bool first = micro_batch == 0;
    shard_stream->submit([=] { accumulate_cpu(acc, acc_dtype, src, src_dtype, n, first); });
  }
  if (micro_batch == o.micro_batches - 1 && o.replicate_size > 1) {
    replicate_stream->wait(shard_stream->record());
    maybe_serialize(mesh.replicate->all_reduce(unit.grad_shard, unit.grad_shard, ro));
    after_reduction(u, micro_batch, *replicate_stream);
  } else {
    after_reduction(u, micro_batch, *shard_stream);
  }
}

// After the unit's reduction was issued on `stream`: note when it lands,
// and with optimizer_in_backward update the unit right there.
void Engine::Impl::after_reduction(int u, int micro_batch, CpuStream& stream) {
  if (micro_batch != o.micro_batches - 1) return;
  EngineUnit& unit = units[static_cast<size_t>(u)];
  if (o.optimizer_in_backward) {
    if (!ib_planned) {
      // No clipping and no loss scaling: the decision needs no statistics.
      ib_plan = opt->plan_step(0.0, false, grad_divisor());
      ib_planned = true;
    }
    const StepPlan plan = ib_plan;
    const float multiplier = plan.scalars.grad_multiplier;
    stream.submit([this, u, plan, multiplier] {
      EngineUnit& eu = units[static_cast<size_t>(u)];
      const GradStats s = grad_stats_cpu(eu.grad_shard.data(), eu.grad_shard.dtype(), eu.n, multiplier);
      eu.ib_sum_sq = s.sum_sq;
      eu.ib_non_finite = s.non_finite;
      update_unit(u, plan);
    });
    if (o.keeps_full_params() && o.prefetch_depth > 0) {
      shard_stream->wait(stream.record());
      issue_full_gather(u);
    } else if (o.keeps_full_params()) {
      unit.full_stale = true;  // gathered on demand by the next forward, after step() saw the update land
    }
  }
  unit.reduced = stream.record();
}

}  // namespace mp

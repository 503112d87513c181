#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/convert.h"
#include "kernels/cpu/grad_stats.h"
#include "kernels/philox_math.h"
#include "kernels/remainder_math.h"
#include "runtime/engine_impl.h"
#include "core/error.h"
#include "runtime/fault.h"

namespace mp {
namespace {

using SC = proto::ShardingConfig;

double seconds(Engine::Impl::Clock::time_point since) {
  return std::chrono::duration<double>(Engine::Impl::Clock::now() - since).count();
}

CpuStream& cpu_stream(Communicator& c) {
  auto* s = dynamic_cast<CpuStream*>(&c.stream());
  MP_ENFORCE(s != nullptr, "communicator '", c.name(), "' has no CPU stream");
  return *s;
}

// Element `index` of parameter stream `stream`: uniform in [-1, 1) or
// standard normal (Box-Muller on two Philox words).
float init_value(const ParamInit& init, uint64_t seed, uint64_t stream, uint64_t index) {
  switch (init.kind) {
    case ParamInit::Kind::kZeros: return 0.0f;
    case ParamInit::Kind::kOnes: return 1.0f;
    case ParamInit::Kind::kUniform: {
      const double u = math::philox_u32(seed, stream, index) * 0x1p-32;
      return static_cast<float>(init.scale * (2.0 * u - 1.0));
    }
    case ParamInit::Kind::kNormal: {
      const double u1 = (math::philox_u32(seed, stream, 2 * index) + 1.0) * 0x1p-32;  // (0, 1]
      const double u2 = math::philox_u32(seed, stream, 2 * index + 1) * 0x1p-32;
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      return static_cast<float>(init.scale * z);
    }
  }
  return 0.0f;
}

// Stochastic rounding's global element index: unit in the high bits, the
// element's place in the unit below, so it does not depend on the sharding.
uint64_t global_index(int unit, int64_t offset) {
  return (static_cast<uint64_t>(unit) << 40) + static_cast<uint64_t>(offset);
}

}  // namespace

Engine::Impl::Impl(const ModelSpec& model, const proto::EngineConfig& config, Communicator& w, Allocator allocator)
    : spec(model),
      o(resolve_engine_options(config, w.size())),
      layout(model, o.shard_size),
      alloc(std::move(allocator)),
      opt(std::make_unique<Optimizer>(config.optimizer())),
      world(w) {
  if (!world.device().is_cpu() || !alloc.device().is_cpu()) {
    MP_THROW(ConfigError, "the sharded engine runs on CPU communicators and memory in this version; '", world.name(),
             "' is on ", world.device());
  }
  if (o.precision.loss_scaling == LossScalingMode::kDynamic && !config.optimizer().has_loss_scaling()) {
    proto::OptimizerConfig with_scaling = config.optimizer();
    with_scaling.mutable_loss_scaling();  // GradScaler's defaults
    opt = std::make_unique<Optimizer>(with_scaling);
  }
  if (o.deterministic && o.precision.loss_scaling != LossScalingMode::kNone) {
    MP_THROW(ConfigError, "deterministic reduces fp32 gradients; loss scaling (precision.loss_scaling) does not apply");
  }
  mesh = make_mesh(world, o.shard_size);
  shard_stream = &cpu_stream(*mesh.shard);
  replicate_stream = &cpu_stream(*mesh.replicate);
  if (!o.comm_hook.empty()) hook = CommHookRegistry().make(o.comm_hook, alloc);

  const Precision& p = o.precision;
  const int shard_rank = mesh.shard->rank();
  auto tensor = [&](DType t, int64_t n, MemCategory c) { return Tensor::zeros(alloc, t, {n}, c); };
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitLayout& ul = layout.unit(u);
    EngineUnit unit;
    unit.n = ul.shard_numel;
    unit.full = ul.padded_numel;
    unit.offset = shard_rank * unit.n;
    if (p.master == MasterMode::kFp32) unit.master = tensor(DType::kF32, unit.n, MemCategory::kMaster);
    if (p.master == MasterMode::kBf16Remainder) {
      unit.remainder = alloc.allocate(static_cast<size_t>(unit.n) * 2, MemCategory::kMaster);
    }
    if (o.persistent_param_shard()) unit.param_shard = tensor(p.param_dtype, unit.n, MemCategory::kParamShards);
    if (o.state_count >= 1) unit.state0 = tensor(p.state_dtype, unit.n, MemCategory::kOptimizerState);
    if (o.state_count >= 2) unit.state1 = tensor(p.state_dtype, unit.n, MemCategory::kOptimizerState);
    if (o.deterministic) {
      unit.acc64 = alloc.allocate(static_cast<size_t>(unit.n) * 8, MemCategory::kGradient);
      unit.grad_shard = tensor(DType::kF32, unit.n, MemCategory::kGradient);
    } else {
      if (o.full_grad_accumulators()) unit.acc_full = tensor(p.grad_accum_dtype, unit.full, MemCategory::kGradient);
      unit.grad_shard = o.strategy == SC::NO_SHARD ? unit.acc_full
                                                   : tensor(o.grad_shard_dtype(), unit.n, MemCategory::kGradient);
    }
    if (o.keeps_full_params()) unit.full_params = tensor(p.param_dtype, unit.full, MemCategory::kGatheredParams);
    std::vector<ShardParam> params;
    for (const ParamPlacement& pp : ul.params) {
      const int64_t b = std::max(pp.offset, unit.offset), e = std::min(pp.offset + pp.numel, unit.offset + unit.n);
      if (b < e) params.push_back(ShardParam{pp.name, b - unit.offset, e - unit.offset, static_cast<int>(pp.shape.size())});
    }
    unit.ranges = params.empty() ? std::vector<UpdateRange>{UpdateRange{0, unit.n, 1.0f, 0.0f}}
                                 : opt->ranges_for(params, unit.n);
    units.push_back(std::move(unit));
  }
  const int64_t p_max = layout.max_padded_numel(), n_max = layout.max_shard_numel();
  for (auto& g : grad_in) g = tensor(DType::kF32, p_max, MemCategory::kGradient);
  slots.resize(static_cast<size_t>(o.gather_slots(layout.num_units())));
  for (GatherSlot& s : slots) s.buffer = tensor(p.param_dtype, p_max, MemCategory::kGatheredParams);
  if (p.param_cast == ParamCast::kAtGather) {
    cast_staging = tensor(p.param_dtype, o.shard_size > 1 ? n_max : p_max, MemCategory::kCommScratch);
  }
  const bool no_shard_cast = o.strategy == SC::NO_SHARD && !o.deterministic && o.comm_hook.empty() &&
                             (p.reduce_dtype != p.grad_accum_dtype || p.loss_scaling != LossScalingMode::kNone);
  if (o.wire_staging() || no_shard_cast) wire = tensor(p.reduce_dtype, p_max, MemCategory::kCommScratch);
  if (!o.deterministic && o.sharded_accumulation && o.micro_batches > 1 && !o.full_grad_accumulators()) {
    rs_scratch = tensor(o.reduce_out_dtype(), n_max, MemCategory::kCommScratch);
  }
  if (o.deterministic && o.shard_size > 1) recv = tensor(DType::kF32, p_max, MemCategory::kCommScratch);
  mean_at_cast = o.full_grad_accumulators() &&
                 (wire.defined() || (hook && p.loss_scaling != LossScalingMode::kNone));
  if (o.deterministic && o.replicate_size > 1) {
    gathered = tensor(DType::kF32, o.replicate_size * p_max, MemCategory::kCommScratch);
  }
  init_params();
}

void Engine::Impl::init_params() {
  std::vector<float> values;
  for (int u = 0; u < layout.num_units(); ++u) {
    const EngineUnit& unit = units[static_cast<size_t>(u)];
    values.assign(static_cast<size_t>(unit.n), 0.0f);
    const UnitLayout& ul = layout.unit(u);
    for (size_t k = 0; k < ul.params.size(); ++k) {
      const ParamPlacement& pp = ul.params[k];
      const int64_t b = std::max(pp.offset, unit.offset), e = std::min(pp.offset + pp.numel, unit.offset + unit.n);
      const uint64_t stream = (static_cast<uint64_t>(u) << 32) | k;
      for (int64_t i = b; i < e; ++i) {
        values[static_cast<size_t>(i - unit.offset)] =
            init_value(pp.init, o.seed, stream, static_cast<uint64_t>(i - pp.offset));
      }
    }
    set_shard_weights(u, values);
  }
  if (o.keeps_full_params()) {
    for (int u = 0; u < layout.num_units(); ++u) issue_full_gather(u);
  }
}

void Engine::Impl::set_shard_weights(int u, const std::vector<float>& values) {
  const Precision& p = o.precision;
  EngineUnit& unit = units[static_cast<size_t>(u)];
  MP_ENFORCE_EQ(static_cast<int64_t>(values.size()), unit.n);
  const Tensor v = Tensor::wrap(const_cast<float*>(values.data()), Device::cpu(), DType::kF32, {unit.n});
  if (p.master == MasterMode::kFp32) copy_tensor(unit.master, v);
  if (p.master == MasterMode::kBf16Remainder) {
    auto* h = unit.param_shard.data_as<bf16>();
    auto* r = static_cast<int16_t*>(unit.remainder.data());
    for (int64_t i = 0; i < unit.n; ++i) {
      const math::Bf16Remainder s = math::split_bf16_remainder(values[static_cast<size_t>(i)]);
      h[i].bits = s.h;
      r[i] = s.r;
    }
  } else if (unit.param_shard.defined()) {
    convert(v, unit.param_shard);
  }
}

void Engine::Impl::state_replaced() {
  for (GatherSlot& s : slots) {  // gathered from the old state
    wait(s.work);
    s.work.reset();
    s.unit = -1;
  }
  for (int u = 0; u < layout.num_units(); ++u) {
    EngineUnit& unit = units[static_cast<size_t>(u)];
    wait(unit.full_gather);
    unit.full_gather.reset();
    if (o.keeps_full_params()) issue_full_gather(u);
  }
}

double Engine::Impl::grad_divisor() const {
  const double k = o.micro_batches;
  const double base = o.deterministic ? static_cast<double>(world.size()) * k : mean_at_cast ? 1.0 : k;
  return base * (o.precision.loss_scaling == LossScalingMode::kStatic ? o.precision.static_loss_scale : 1.0);
}

double Engine::Impl::loss_scale_now() const {
  if (o.precision.loss_scaling == LossScalingMode::kStatic) return o.precision.static_loss_scale;
  return opt->loss_scaler() ? opt->loss_scaler()->scale() : 1.0;
}

void Engine::Impl::wait(const WorkPtr& w) {
  if (!w) return;
  const auto t0 = Clock::now();
  w->wait();
  timings.exposed_comm_s += seconds(t0);
}

// An event of the communication thread (a unit's reductions, a free
// gradient buffer): bounded by the communicator's timeout like a Work's
// wait. On expiry the first collective still pending is waited on at once,
// which throws CommError naming it, its sequence number and the ranks that
// did not arrive (Note [What completion means] in comm/work.h).
void Engine::Impl::wait(const Event& e) {
  const auto t0 = Clock::now();
  const std::chrono::milliseconds timeout = world.options().timeout;
  if (!e.wait_for(timeout)) {
    for (const WorkPtr& w : recent_works) {
      if (!w->is_completed()) w->wait(std::chrono::milliseconds(0));
    }
    abandon_cpu_streams();
    MP_THROW(CommError, "step ", steps_run, ": the communication thread did not finish within ",
             static_cast<double>(timeout.count()) / 1000.0, " s, with no collective pending");
  }
  timings.exposed_comm_s += seconds(t0);
}

// The all-gather's source: this rank's shard in param dtype.
Tensor Engine::Impl::gather_source(int u) {
  EngineUnit& unit = units[static_cast<size_t>(u)];
  if (unit.param_shard.defined()) return unit.param_shard;
  if (o.precision.param_cast != ParamCast::kAtGather) return unit.master;  // fp32 params
  Tensor staging = cast_staging.flat(0, unit.n);
  convert(unit.master, staging, {}, shard_stream);  // on the communication thread, before the gather
  cast_elements += unit.n;
  return staging;
}

void Engine::Impl::issue_gather(int u, GatherSlot& slot) {
  if (slot.work) wait(slot.work);
  const EngineUnit& unit = units[static_cast<size_t>(u)];
  slot.unit = u;
  slot.last_use = ++tick;
  slot.work = mesh.shard->all_gather(gather_source(u), slot.buffer.flat(0, unit.full));
  maybe_serialize(slot.work);
}

void Engine::Impl::issue_full_gather(int u) {
  EngineUnit& unit = units[static_cast<size_t>(u)];
  unit.full_stale = false;
  unit.full_gather = mesh.shard->all_gather(gather_source(u), unit.full_params);
  maybe_serialize(unit.full_gather);
}

// Unit u's full parameters for compute; direction +1 forward, -1 backward
// (which neighbours to prefetch).
Tensor Engine::Impl::params_for(int u, int direction) {
  EngineUnit& unit = units[static_cast<size_t>(u)];
  if (o.keeps_full_params()) {
    if (unit.full_stale) issue_full_gather(u);  // prefetch off: gathered when needed
    wait(unit.full_gather);
    unit.full_gather.reset();
    return unit.full_params;
  }
  if (!o.gathers_per_unit()) {  // one rank per shard group: the shard is the unit
    if (o.precision.param_cast != ParamCast::kAtGather) return gather_source(u);
    Tensor staging = cast_staging.flat(0, unit.full);
    convert(unit.master, staging);
    cast_elements += unit.full;
    return staging;
  }
  const int num_units = layout.num_units();
  std::vector<int> wanted{u};
  for (int d = 1; d <= o.prefetch_depth; ++d) {
    const int v = u + d * direction;
    if (v >= 0 && v < num_units) wanted.push_back(v);
  }
  auto find = [&](int v) -> GatherSlot* {
    for (GatherSlot& s : slots) {
      if (s.unit == v) return &s;
    }
    return nullptr;
  };
  auto free_slot = [&]() -> GatherSlot& {
    GatherSlot* best = nullptr;
    for (GatherSlot& s : slots) {
      if (std::find(wanted.begin(), wanted.end(), s.unit) != wanted.end()) continue;
      if (!best || s.last_use < best->last_use) best = &s;
    }
    MP_ENFORCE(best != nullptr, "no free gather slot among ", slots.size());
    return *best;
  };
  for (int v : wanted) {  // u first, then the prefetches in order of use
    if (!find(v)) issue_gather(v, free_slot());
  }
  GatherSlot* slot = find(u);
  slot->last_use = ++tick;
  wait(slot->work);
  slot->work.reset();
  return slot->buffer.flat(0, unit.full);
}

void Engine::Impl::update_unit(int u, const StepPlan& plan) {
  EngineUnit& unit = units[static_cast<size_t>(u)];
  const Precision& p = o.precision;
  UpdateArgs a;
  a.n = unit.n;
  a.master_mode = p.master;
  a.master = unit.master.defined() ? unit.master.data_as<float>() : nullptr;
  a.master_remainder = static_cast<int16_t*>(unit.remainder.data());
  a.state0 = unit.state0.defined() ? unit.state0.data() : nullptr;
  a.state1 = unit.state1.defined() ? unit.state1.data() : nullptr;
  a.state_dtype = p.state_dtype;
  a.grad = unit.grad_shard.data();
  a.grad_dtype = unit.grad_shard.dtype();
  a.param_out = unit.param_shard.defined() ? unit.param_shard.data() : nullptr;
  a.param_dtype = unit.param_shard.defined() ? p.param_dtype : DType::kBF16;
  a.rounding = p.rounding;
  a.seed = o.seed;
  a.index_offset = global_index(u, unit.offset);
  a.ranges = unit.ranges.data();
  a.num_ranges = static_cast<int64_t>(unit.ranges.size());
  opt->apply_cpu(a, plan);
}

StepResult Engine::Impl::step(Model& model) {
  const auto t_step = Clock::now();
  timings = StepTimings{};
  const int64_t casts_before = cast_elements;
  ++steps_run;
  inject_step_faults(steps_run, world.rank());  // MP_FAULT (tests): kill, hang, sleep
  first_bad_unit = -1;
  const int k = o.micro_batches, W = world.size(), r = world.rank(), U = layout.num_units();
  ib_planned = false;
  std::vector<double> losses(static_cast<size_t>(k));
  auto compute = [&](auto&& f) {
    const auto t0 = Clock::now();
    f();
    timings.compute_s += seconds(t0);
  };
  for (int m = 0; m < k; ++m) {
    const int64_t g = (steps_run - 1) * static_cast<int64_t>(W) * k + static_cast<int64_t>(m) * W + r;
    compute([&] { model.begin_micro_batch(g); });
    for (int u = 0; u < U; ++u) {
      const Tensor params = params_for(u, +1);
      compute([&] { model.forward(u, params); });
    }
    losses[static_cast<size_t>(m)] = model.loss();
    for (int u = U - 1; u >= 0; --u) {
      const Tensor params = params_for(u, -1);
      int index = 0;
      const Tensor grads = take_grad_buffer(u, index);
      compute([&] { model.backward(u, params, grads); });
      if (const Fault* f = find_fault(FaultKind::kNan, steps_run, r); f != nullptr && f->unit == u) {
        std::fill_n(grads.data_as<float>(), layout.unit(u).numel, std::numeric_limits<float>::quiet_NaN());
      }
      // Which rank and unit produced non-finite values, while it is still
      // known (the reduction spreads them to every rank): one read of the
      // unit's fp32 gradients, until the first bad unit is found.
      if (o.locate_non_finite && first_bad_unit < 0 && grad_stats_cpu(grads.data(), DType::kF32, layout.unit(u).numel, 1.0f).non_finite) {
        first_bad_unit = u;
      }
      reduce_unit(u, m, index);
    }
  }

  // Statistics of every gradient shard, in unit order.
  const double divisor = grad_divisor();
  const float multiplier = static_cast<float>(opt->unscale_multiplier(divisor));
  double sum_sq = 0;
  bool non_finite = false;
  for (int u = 0; u < U; ++u) {
    EngineUnit& unit = units[static_cast<size_t>(u)];
    wait(unit.reduced);
    const auto t0 = Clock::now();
    GradStats s;
    if (o.optimizer_in_backward) {
      s = GradStats{unit.ib_sum_sq, unit.ib_non_finite};
    } else {
      s = grad_stats_cpu(unit.grad_shard.data(), unit.grad_shard.dtype(), unit.n, multiplier);
    }
    timings.update_s += seconds(t0);
    sum_sq += s.sum_sq;
    non_finite = non_finite || s.non_finite;
  }
  // One exchange over the shard group (replicas hold the same shards): the
  // fp64 sum of squares and the non-finite flag of every rank, summed in rank
  // order on the control plane (Note [Control plane]).
  if (mesh.shard->size() > 1) {
    const double mine[2] = {sum_sq, non_finite ? 1.0 : 0.0};
    const std::vector<double> all = mesh.shard->all_gather_double(mine);
    sum_sq = 0;
    non_finite = false;
    for (size_t j = 0; j < all.size(); j += 2) {
      sum_sq += all[j];
      non_finite = non_finite || all[j + 1] != 0.0;
    }
  }
  // Deterministic mode: the fp32 rounding of the norm, so the fp64 sum's
  // order (which follows the sharding) does not reach the clip coefficient.
  if (o.deterministic) sum_sq = static_cast<double>(static_cast<float>(sum_sq));

  StepResult result;
  result.step = steps_run;
  StepPlan plan;
  if (o.optimizer_in_backward) {  // the units were updated as their gradients landed
    plan = ib_plan;
    plan.grad_norm = non_finite ? std::nan("") : std::sqrt(sum_sq);
  } else {
    plan = opt->plan_step(sum_sq, non_finite, divisor);
  }
  if (plan.skip && o.locate_non_finite) locate_non_finite(result);
  consecutive_skips = plan.skip ? consecutive_skips + 1 : 0;
  result.consecutive_skips = consecutive_skips;
  const auto t_update = Clock::now();
  if (!plan.skip) {
    for (GatherSlot& s : slots) {  // gathered before the update: stale now
      wait(s.work);
      s.work.reset();
      s.unit = -1;
    }
  }
  for (int u = 0; u < U && !plan.skip; ++u) {
    if (!o.optimizer_in_backward) {
      update_unit(u, plan);
      if (o.keeps_full_params() && o.prefetch_depth > 0) issue_full_gather(u);
      if (o.keeps_full_params() && o.prefetch_depth == 0) units[static_cast<size_t>(u)].full_stale = true;
    }
    // The next step's first units, gathered while the other units update.
    if (o.gathers_per_unit() && o.prefetch_depth > 0 && u < static_cast<int>(slots.size())) {
      issue_gather(u, slots[static_cast<size_t>(u)]);
    }
  }
  timings.update_s += seconds(t_update);
  if (o.optimizer_in_backward && non_finite) {
    MP_THROW(NumericError, "step ", steps_run, ": non-finite gradients reached the update with ",
             "sharding.optimizer_in_backward (nothing can skip the step there); turn it off to skip such steps");
  }
  result.loss = mean_loss(losses);
  result.grad_norm = plan.grad_norm;
  result.skipped = plan.skip;
  result.loss_scale = o.precision.loss_scaling == LossScalingMode::kStatic ? o.precision.static_loss_scale
                                                                            : plan.loss_scale;
  result.lr = plan.lr;
  result.param_cast_elements = cast_elements - casts_before;
  timings.total_s = seconds(t_step);
  result.timings = timings;
  if (plan.skip) {
    // Every rank took the same decision from the same exchanged flag, so
    // every rank stops here together, with the weights of the last step.
    const std::string where =
        result.non_finite_rank >= 0
            ? detail::str("first from rank ", result.non_finite_rank, ", unit ", layout.unit(result.non_finite_unit).name)
            : o.locate_non_finite ? std::string("in the reduction (every rank's own gradients were finite)")
                                  : std::string("rank and unit not located (engine.locate_non_finite names them)");
    if (o.stop_on_non_finite && o.precision.loss_scaling == LossScalingMode::kNone) {
      MP_THROW_AGREED(NumericError, "step ", steps_run, ": non-finite gradients, ", where,
                      "; stopping (non_finite = NON_FINITE_STOP): weights and moments are those after step ",
                      steps_run - 1);
    }
    if (consecutive_skips >= o.max_consecutive_skips) {
      MP_THROW_AGREED(NumericError, "step ", steps_run, ": ", consecutive_skips,
                      " steps in a row had non-finite gradients (", where,
                      " this time); stopping (max_consecutive_skips = ", o.max_consecutive_skips, ")");
    }
  }
  return result;
}

// After a step found non-finite gradients: the lowest rank whose own
// gradients were not finite, and its first such unit. Collective over the
// world (every rank calls it on the same steps).
void Engine::Impl::locate_non_finite(StepResult& result) {
  const int64_t mine = first_bad_unit;
  const std::vector<int64_t> all = world.all_gather_int64(std::span<const int64_t>(&mine, 1));
  for (size_t j = 0; j < all.size(); ++j) {
    if (all[j] >= 0) {
      result.non_finite_rank = static_cast<int>(j);
      result.non_finite_unit = static_cast<int>(all[j]);
      return;
    }
  }
}

// The mean of every rank's micro-batch losses (losses[m] is this rank's
// m-th), summed in the order of their global index m * W + r, so it does not
// depend on the world size. Collective over the world.
double Engine::Impl::mean_loss(const std::vector<double>& losses) {
  const size_t k = losses.size(), W = static_cast<size_t>(world.size());
  const std::vector<double> all = world.all_gather_double(losses);
  double loss = 0;
  for (size_t m = 0; m < k; ++m) {
    for (size_t j = 0; j < W; ++j) loss += all[j * k + m];
  }
  return loss / static_cast<double>(W * k);
}

double Engine::Impl::evaluate(Model& model, int64_t first, int count) {
  MP_ENFORCE(count >= 1 && first >= 0, "evaluate: first ", first, ", count ", count);
  const int W = world.size(), r = world.rank(), U = layout.num_units();
  std::vector<double> losses(static_cast<size_t>(count));
  for (int j = 0; j < count; ++j) {
    model.begin_micro_batch(first + static_cast<int64_t>(j) * W + r);
    for (int u = 0; u < U; ++u) model.forward(u, params_for(u, +1));
    losses[static_cast<size_t>(j)] = model.loss();
  }
  return mean_loss(losses);
}

std::vector<float> Engine::Impl::master_shard(int u) const {
  const EngineUnit& unit = units.at(static_cast<size_t>(u));
  std::vector<float> out(static_cast<size_t>(unit.n));
  switch (o.precision.master) {
    case MasterMode::kFp32:
      std::memcpy(out.data(), unit.master.data(), out.size() * 4);
      break;
    case MasterMode::kBf16Remainder: {
      const auto* h = unit.param_shard.data_as<bf16>();
      const auto* r = static_cast<const int16_t*>(unit.remainder.data());
      for (int64_t i = 0; i < unit.n; ++i) out[static_cast<size_t>(i)] = math::merge_bf16_remainder(h[i].bits, r[i]);
      break;
    }
    case MasterMode::kNone:
      convert(unit.param_shard, Tensor::wrap(out.data(), Device::cpu(), DType::kF32, {unit.n}));
      break;
  }
  return out;
}

// ---- Engine ------------------------------------------------------------------

Engine::Engine(const ModelSpec& spec, const proto::EngineConfig& config, Communicator& world, Allocator allocator)
    : impl_(std::make_unique<Impl>(spec, config, world, std::move(allocator))) {}

Engine::~Engine() {
  if (!impl_) return;
  if (cpu_streams_abandoned()) {
    // A collective timed out and may still be writing into the engine's
    // buffers from a stuck communication thread: keep them (the process
    // is ending).
    (void)impl_.release();
    return;
  }
  // Let issued collectives and tasks finish before their buffers go.
  try {
    impl_->shard_stream->synchronize();
    impl_->replicate_stream->synchronize();
  } catch (...) {
    // A failed collective was reported where it was waited for.
  }
}

const EngineOptions& Engine::options() const { return impl_->o; }
const FlatLayout& Engine::layout() const { return impl_->layout; }
const Optimizer& Engine::optimizer() const { return *impl_->opt; }
int Engine::shard_rank() const { return impl_->mesh.shard->rank(); }
MemStats Engine::memory() const { return impl_->alloc.stats(); }
MemoryPlan Engine::plan() const { return plan_memory(impl_->spec, impl_->o); }
StepResult Engine::step(Model& model) { return impl_->step(model); }
double Engine::evaluate(Model& model, int64_t first, int count) { return impl_->evaluate(model, first, count); }
std::vector<float> Engine::master_shard(int unit) const { return impl_->master_shard(unit); }

void Engine::set_weights(int unit, const std::vector<float>& full) {
  Impl& e = *impl_;
  const UnitLayout& ul = e.layout.unit(unit);
  if (static_cast<int64_t>(full.size()) != ul.numel) {
    MP_THROW(ConfigError, "set_weights of unit ", ul.name, ": ", full.size(), " values, the unit has ", ul.numel);
  }
  const EngineUnit& u = e.units[static_cast<size_t>(unit)];
  std::vector<float> mine(static_cast<size_t>(u.n), 0.0f);
  for (int64_t i = u.offset; i < std::min(u.offset + u.n, ul.numel); ++i) {
    mine[static_cast<size_t>(i - u.offset)] = full[static_cast<size_t>(i)];
  }
  e.set_shard_weights(unit, mine);
  e.state_replaced();
}

std::vector<float> Engine::gather_master(int unit) {
  std::vector<float> mine = impl_->master_shard(unit);
  Communicator& shard = *impl_->mesh.shard;
  std::vector<float> all(mine.size() * static_cast<size_t>(shard.size()));
  shard.all_gather(Tensor::wrap(mine.data(), Device::cpu(), DType::kF32, {static_cast<int64_t>(mine.size())}),
                   Tensor::wrap(all.data(), Device::cpu(), DType::kF32, {static_cast<int64_t>(all.size())}))
      ->wait();
  all.resize(static_cast<size_t>(impl_->layout.unit(unit).numel));
  return all;
}

}  // namespace mp

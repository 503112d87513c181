#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/philox_math.h"
#include "runtime/engine_impl.h"
#include "runtime/fault.h"

namespace mp {
namespace {

double seconds(Engine::Impl::Clock::time_point since) {
  return std::chrono::duration<double>(Engine::Impl::Clock::now() - since).count();
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

// The engine's device: its allocator's, which must be its communicator's
// (checked before anything is allocated there).
Device engine_device(const Communicator& world, const Allocator& alloc) {
  if (world.device() != alloc.device()) {
    MP_THROW(ConfigError, "the engine's memory is on ", alloc.device(), " but its communicator '", world.name(),
             "' moves tensors on ", world.device(), ": give both the same device");
  }
  return alloc.device();
}

// The optimizer's config; dynamic loss scaling without settings takes
// GradScaler's defaults.
proto::OptimizerConfig optimizer_config(const proto::EngineConfig& config, const EngineOptions& o) {
  proto::OptimizerConfig c = config.optimizer();
  if (o.precision.loss_scaling == LossScalingMode::kDynamic && !c.has_loss_scaling()) c.mutable_loss_scaling();
  return c;
}

}  // namespace

Engine::Impl::Impl(const ModelSpec& model, const proto::EngineConfig& config, Communicator& w, Allocator allocator)
    : spec_(model),
      o_(resolve_engine_options(config, w.size())),
      layout_(model, o_.shard_size),
      recomputed_(recomputed_units(model, o_.recompute_every)),
      alloc_(std::move(allocator)),
      opt_(std::make_unique<Optimizer>(optimizer_config(config, o_))),
      world_(w),
      device_(engine_device(w, alloc_)),
      comm_(w, o_.serialize_communication, steps_run_),
      stats_(layout_.num_units(), o_.micro_batches, o_.locate_non_finite, alloc_),
      decision_(*opt_, o_.optimizer_in_backward) {
  set_current_device(device_);
  // Host waits on it are bounded by the world's timeout (Note [Bounded host waits] in core/host_wait.h).
  compute_ = Stream::create(device_, "compute",
                            StreamOptions{.lags_under_torture = true, .wait_timeout = w.options().timeout});
  losses_ = PinnedBuffer(device_, static_cast<size_t>(o_.micro_batches) * sizeof(double));
  scalars_host_ = PinnedBuffer(device_, sizeof(StepScalars));
  comm_.set_compute(compute_.get());
  scalars_device_ = alloc_.allocate(sizeof(StepScalars), MemCategory::kOther);
  if (o_.deterministic && o_.precision.loss_scaling != LossScalingMode::kNone) {
    MP_THROW(ConfigError, "deterministic reduces fp32 gradients; loss scaling (precision.loss_scaling) does not apply");
  }
  mesh_ = make_mesh(world_, o_.shard_size);
  shard_stream_ = &mesh_.shard->stream();
  replicate_stream_ = &mesh_.replicate->stream();
  units_.reserve(static_cast<size_t>(layout_.num_units()));
  for (int u = 0; u < layout_.num_units(); ++u) {
    units_.emplace_back(u, layout_.unit(u), mesh_.shard->rank(), o_, *opt_, alloc_, *compute_);
  }
  compute_->synchronize();  // the range tables are on the device
  reducer_ = std::make_unique<GradReducer>(o_, layout_, units_, mesh_, *shard_stream_, *replicate_stream_, *compute_,
                                           *opt_, comm_, alloc_);
  gathers_ = std::make_unique<ParamGathers>(o_, layout_, units_, *mesh_.shard, *shard_stream_, comm_, alloc_);
  matrices_ = make_matrix_step(layout_, o_, *opt_, *mesh_.shard, comm_, alloc_);
  reduced_.assign(static_cast<size_t>(layout_.num_units()), 0);
  unsharded_.assign(static_cast<size_t>(layout_.num_units()), 0);
  init_params();
}

void Engine::Impl::init_params() {
  std::vector<float> values;
  for (int u = 0; u < layout_.num_units(); ++u) {
    UnitState& unit = units_[static_cast<size_t>(u)];
    values.assign(static_cast<size_t>(unit.n()), 0.0f);
    const UnitLayout& ul = layout_.unit(u);
    for (size_t k = 0; k < ul.params.size(); ++k) {
      const ParamPlacement& pp = ul.params[k];
      const int64_t b = std::max(pp.offset, unit.offset()), e = std::min(pp.offset + pp.numel, unit.offset() + unit.n());
      const uint64_t stream = (static_cast<uint64_t>(u) << 32) | k;
      for (int64_t i = b; i < e; ++i) {
        values[static_cast<size_t>(i - unit.offset())] =
            init_value(pp.init, o_.seed, stream, static_cast<uint64_t>(i - pp.offset));
      }
    }
    unit.set_weights(values, *compute_);
  }
  gathers_->replaced();  // the first gathers where the strategy keeps full params
}

// Enqueues one model call on the compute stream between two timed events
// (the step's compute time); returns the event after it.
template <class F>
Event Engine::Impl::on_compute(F&& enqueue) {
  Event before = compute_->record_timed();
  enqueue();
  Event after = compute_->record_timed();
  compute_spans_.emplace_back(std::move(before), after);
  return after;
}

// ---- the step (Note [Engine schedule], Note [Engine events]) --------------------
// The host thread only enqueues: model calls and the engine's ops on the
// compute stream, collectives on the communication streams, ordered by
// events. It waits twice: for the statistics (the step's one device-to-host
// read) and for the end of the step's compute.

StepResult Engine::Impl::step(Model& model) {
  check_recomputation(model);
  open_step();
  const int k = o_.micro_batches, W = world_.size(), r = world_.rank();
  for (int m = 0; m < k; ++m) {
    const int64_t g = (steps_run_ - 1) * static_cast<int64_t>(W) * k + static_cast<int64_t>(m) * W + r;
    on_compute([&] { model.begin_micro_batch_on(g, *compute_); });
    forward(model);                                // gather ring: each unit waited for, the next k prefetched
    model.loss_on(losses_.as<double>() + m, *compute_);
    backward(model);                               // each unit's reduction issued as its gradients exist
  }
  return finish_step(/*checked=*/false);           // statistics, decision, updates, next gathers
}

// The step's counters and faults, at its first part.
void Engine::Impl::open_step() {
  if (step_open_) return;
  begin_step();
  step_open_ = true;
  reduced_.assign(static_cast<size_t>(layout_.num_units()), 0);
  losses_noted_ = 0;
  std::fill_n(losses_.as<double>(), o_.micro_batches, std::numeric_limits<double>::quiet_NaN());
}

void Engine::Impl::begin_step() {
  set_current_device(device_);  // the thread that steps may not be the one that constructed
  step_start_ = Clock::now();
  timings_ = StepTimings{};
  comm_.reset_exposed();
  compute_spans_.clear();
  scalars_written_ = false;
  casts_before_ = gathers_->cast_elements();
  ++steps_run_;
  inject_step_faults(steps_run_, world_.rank());  // MP_FAULT (tests): kill, hang, sleep
  if (find_fault(FaultKind::kDeviceFault, steps_run_, world_.rank()) != nullptr) {
    std::fprintf(stderr, "[rank %d] MP_FAULT: device fault on %s at step %lld\n", world_.rank(),
                 to_string(device_).c_str(), static_cast<long long>(steps_run_));
    ops::device_fault(*compute_);
  }
  decision_.begin(reducer_->divisor());
}

void Engine::Impl::check_recomputation(const Model& model) const {
  for (int u = 0; u < layout_.num_units(); ++u) {
    const bool engine = recomputed_[static_cast<size_t>(u)], own = model.recomputes(u);
    if (engine == own) continue;
    MP_THROW(ConfigError, "unit '", layout_.unit(u).name, "': engine.activation_checkpointing ",
             engine ? "recomputes its activations, but the model keeps them"
                    : "keeps its activations, but the model recomputes them",
             ": build the model for the engine's policy (recomputed_units with k = ", o_.recompute_every,
             "; GptOptions::recompute_every for the GPT)");
  }
}

// Forward of one micro-batch: unit by unit, each gathered (its successors
// prefetched) just before.
void Engine::Impl::forward(Model& model) {
  model.set_params_persist(gathers_->persistent());
  for (int u = 0; u < layout_.num_units(); ++u) {
    const Tensor params = unshard(u, Pass::kForward);
    reshard(u, on_compute([&] { model.forward_on(u, params, *compute_); }));
  }
}

// Backward of one micro-batch, last unit first: each unit's gradients go
// to its reduction while the next unit's backward runs.
void Engine::Impl::backward(Model& model) {
  for (int u = layout_.num_units() - 1; u >= 0; --u) {
    // Note [Activation recomputation]: the forward again, on the backward's gather.
    const bool recompute = recomputed_[static_cast<size_t>(u)];
    const bool reads = layout_.unit(u).backward_reads_params || recompute;  // else nothing to gather
    const Tensor params = reads ? unshard(u, Pass::kBackward) : Tensor();
    if (recompute) on_compute([&] { model.recompute_on(u, params, *compute_); });
    const Tensor grads = gradient_buffer(u);
    const Event done = on_compute([&] { model.backward_on(u, params, grads, *compute_); });
    if (reads) reshard(u, done);
    hand_over(u);
  }
}

// ---- the parts (Note [Driving the engine]) ------------------------------------

std::string Engine::Impl::unit_name(int u) const {
  return detail::str("unit ", u, " ('", layout_.unit(u).name, "')");
}

void Engine::Impl::check_unit(int u, const char* call) const {
  if (u < 0 || u >= layout_.num_units()) {
    MP_THROW(ConfigError, call, ": unit ", u, " does not exist (the model has ", layout_.num_units(), " units)");
  }
}

Tensor Engine::Impl::unshard(int u, Pass pass) {
  check_unit(u, "unshard");
  char& held = unsharded_[static_cast<size_t>(u)];
  if (held) MP_THROW(ConfigError, "unshard of ", unit_name(u), ", which is unsharded already: reshard it first");
  set_current_device(device_);
  Tensor params = gathers_->params_for(u, pass == Pass::kForward ? +1 : -1, *compute_);
  held = 1;
  return params;
}

bool Engine::Impl::unsharded(int u) const {
  check_unit(u, "unsharded");
  return unsharded_[static_cast<size_t>(u)] != 0;
}

void Engine::Impl::reshard(int u) {
  check_unit(u, "reshard");
  reshard(u, compute_->record());
}

void Engine::Impl::reshard(int u, Event readers_done) {
  char& held = unsharded_[static_cast<size_t>(u)];
  if (!held) MP_THROW(ConfigError, "reshard of ", unit_name(u), ", which is not unsharded");
  gathers_->release(u, std::move(readers_done));
  held = 0;
}

Tensor Engine::Impl::gradient_buffer(int u) {
  check_unit(u, "gradient_buffer");
  if (taken_ >= 0) {
    MP_THROW(ConfigError, "gradient_buffer of ", unit_name(u), " while the gradients of ", unit_name(taken_),
             " are taken and not reduced: reduce_gradients(", taken_, ") first");
  }
  open_step();
  if (reduced_[static_cast<size_t>(u)] >= o_.micro_batches) {
    MP_THROW(ConfigError, "gradient_buffer of ", unit_name(u), ": its gradients were reduced ",
             reduced_[static_cast<size_t>(u)], " times this step, engine.micro_batches is ", o_.micro_batches,
             ": finish_step first");
  }
  set_current_device(device_);
  taken_buffer_ = reducer_->take_buffer(u, *compute_);
  taken_ = u;
  return taken_buffer_.grads;
}

void Engine::Impl::reduce_gradients(int u) {
  check_unit(u, "reduce_gradients");
  if (taken_ != u) {
    MP_THROW(ConfigError, "reduce_gradients of ", unit_name(u), " without its gradient_buffer",
             taken_ >= 0 ? " (the buffer taken is " + unit_name(taken_) + "'s)" : std::string());
  }
  hand_over(u);
}

// Unit u's gradients of this backward, written by the work enqueued so
// far: their local statistics, then the gathers of the unit whose
// backward comes next (so the compute's next wait is not queued behind
// this reduction on the communication stream; on one core per rank the
// backward's gather waits went from 2-4 ms a unit to nearly none,
// docs/benchmarks.md), then the reduction.
void Engine::Impl::hand_over(int u) {
  const int m = reduced_[static_cast<size_t>(u)]++;
  const GradBuffer grads = taken_buffer_;
  taken_ = -1;
  taken_buffer_ = GradBuffer{};
  const int64_t numel = layout_.unit(u).numel;
  if (const Fault* f = find_fault(FaultKind::kNan, steps_run_, world_.rank()); f != nullptr && f->unit == u) {
    ops::fill_nan(grads.grads, numel, *compute_);
  }
  stats_.take_local(u, m, grads.grads, numel, *compute_);
  const Event written = compute_->record();
  for (int v = u - 1; v >= 0; --v) {
    if (!layout_.unit(v).backward_reads_params && !recomputed_[static_cast<size_t>(v)]) continue;
    gathers_->prefetch(v, -1);
    break;
  }
  reduce(u, m, grads, written);
}

// After every backward of the step: the rest of the schedule (Note
// [Engine schedule]).
StepResult Engine::Impl::finish_step(bool checked) {
  if (checked) check_finish();
  step_open_ = false;
  const GradStats total = reduced_statistics();    // reductions landed: statistics, one read, one exchange
  const StepPlan plan = decision_.decide(&total);  // clip, scale or skip
  StepResult result = note_decision(plan);
  update(plan);                                    // fused updates, each followed by its next gather
  return finish_step(std::move(result), plan, total);
}

StepResult Engine::Impl::finish_step() { return finish_step(/*checked=*/true); }

// Every rank learns whether any rank's step is out of order before any
// rank waits for a reduction a peer may never issue.
void Engine::Impl::check_finish() {
  world_.agree("finish_step of step " + std::to_string(step_open_ ? steps_run_ : steps_run_ + 1), [&] {
    if (!step_open_) MP_THROW(ConfigError, "finish_step without a backward (no unit's gradients were reduced)");
    if (taken_ >= 0) {
      MP_THROW(ConfigError, "finish_step while the gradients of ", unit_name(taken_),
               " are taken and not reduced (reduce_gradients)");
    }
    for (int u = 0; u < layout_.num_units(); ++u) {
      if (unsharded_[static_cast<size_t>(u)]) {
        MP_THROW(ConfigError, "finish_step while ", unit_name(u), " is unsharded: reshard it after its backward");
      }
      const int n = reduced_[static_cast<size_t>(u)];
      if (n != o_.micro_batches) {
        MP_THROW(ConfigError, "finish_step: the gradients of ", unit_name(u), " were reduced ", n, " times, ",
                 "engine.micro_batches is ", o_.micro_batches, n == 0 ? ": no backward reached it" : "");
      }
    }
  });
}

void Engine::Impl::note_loss(double loss) {
  open_step();
  if (losses_noted_ >= o_.micro_batches) {
    MP_THROW(ConfigError, "note_loss: ", losses_noted_ + 1, " losses this step, engine.micro_batches is ",
             o_.micro_batches);
  }
  losses_.as<double>()[losses_noted_++] = loss;
}

// Issues unit u's reduction once `computed`; after the last micro-batch's,
// notes when it lands and, with optimizer_in_backward, updates the unit
// right there.
void Engine::Impl::reduce(int u, int micro_batch, const GradBuffer& grads, const Event& computed) {
  Stream& stream = reducer_->reduce(u, micro_batch, grads, computed);
  if (micro_batch != o_.micro_batches - 1) return;
  if (o_.optimizer_in_backward) update_in_backward(u, stream);
  units_[static_cast<size_t>(u)].set_reduced(stream.record());
}

// The plan's scalars into the device's StepScalars, on the compute stream;
// returns the event after the copy.
Event Engine::Impl::write_scalars(const StepPlan& plan) {
  scalars_copied_.synchronize();  // last step's copy has read the pinned slot (long since, in practice)
  *scalars_host_.as<StepScalars>() = plan.scalars;
  ops::copy_bytes(scalars_device_.data(), device_, scalars_host_.data(), Device::cpu(), sizeof(StepScalars), *compute_);
  scalars_written_ = true;
  scalars_copied_ = compute_->record();
  return scalars_copied_;
}

// Optimizer in backward: unit u's statistics and update on the stream its
// reduction ends on, then its next gather.
void Engine::Impl::update_in_backward(int u, Stream& stream) {
  if (!scalars_written_) scalars_ready_ = write_scalars(decision_.decide(nullptr));  // the first unit's decides the step
  stream.wait(scalars_ready_);
  const UnitState& unit = units_[static_cast<size_t>(u)];
  stats_.take_shard(u, unit.grad_shard(), unit.n(), decision_.multiplier(), stream, reducer_->local_rounding());
  update_unit(u, stream);
  if (matrices_ && matrices_->has(u)) {  // whole matrices: finished after the backward (runtime/matrix_step.h)
    matrices_->begin(u, unit, scalars_host_.as<StepScalars>()->grad_multiplier, stream);
    return;
  }
  gathers_->updated(u, stream.record());
}

// Orders the compute stream after every unit's reductions, takes the
// statistics there and reads them back once; returns the step's global
// gradient statistics (Note [Statistics and decision]).
GradStats Engine::Impl::reduced_statistics() {
  for (int u = 0; u < layout_.num_units(); ++u) comm_.wait_on(*compute_, units_[static_cast<size_t>(u)].reduced());
  stats_begin_ = compute_->record_timed();
  if (!o_.optimizer_in_backward) {  // with it, taken before each update
    for (int u = 0; u < layout_.num_units(); ++u) {
      const UnitState& unit = units_[static_cast<size_t>(u)];
      stats_.take_shard(u, unit.grad_shard(), unit.n(), decision_.multiplier(), *compute_,
                        reducer_->local_rounding());
    }
  }
  const Event read = stats_.read_back(*compute_);
  stats_end_ = compute_->record_timed();
  agree_on_compute("step " + std::to_string(steps_run_), read);  // the forward and backward too
  return stats_.total(*mesh_.shard, o_.deterministic);
}

// The fused update of every unit (done already with optimizer_in_backward),
// each followed by its next gather, so the gathers overlap the updates; a
// kind with whole matrices first finishes them (runtime/matrix_step.h).
void Engine::Impl::update(const StepPlan& plan) {
  update_begin_ = compute_->record_timed();
  if (!plan.skip) {
    gathers_->drop_ring();  // gathered before the update: stale now
    const bool now = !o_.optimizer_in_backward;
    if (now) write_scalars(plan);
    auto next_gathers = [&](int u, bool updated) {
      if (updated) gathers_->updated(u, compute_->record());
      gathers_->prefetch_next_step(u);  // the next step's first units
    };
    for (int u = 0; u < layout_.num_units(); ++u) {
      if (now) update_unit(u, *compute_);
      if (!matrices_) next_gathers(u, now);
      if (matrices_ && now) {
        matrices_->begin(u, units_[static_cast<size_t>(u)], plan.scalars.grad_multiplier, *compute_);
      }
    }
    if (matrices_) {
      matrices_->finish(units_, plan.lr, *compute_);
      for (int u = 0; u < layout_.num_units(); ++u) next_gathers(u, now || matrices_->has(u));
    }
  }
  update_end_ = compute_->record_timed();
}

void Engine::Impl::update_unit(int u, Stream& stream) {
  UpdateArgs args = units_[static_cast<size_t>(u)].update_args(o_);
  args.hyper = opt_->hyper();
  ops::fused_update(args, static_cast<const StepScalars*>(scalars_device_.data()), device_, stream);
}

// The decision's part of the result: skips in a row and, for a skipped step
// with locate_non_finite, where the non-finite gradients began (collective).
StepResult Engine::Impl::note_decision(const StepPlan& plan) {
  StepResult result;
  result.step = steps_run_;
  if (plan.skip && o_.locate_non_finite) {
    std::tie(result.non_finite_rank, result.non_finite_unit) = stats_.locate(world_);
  }
  consecutive_skips_ = plan.skip ? consecutive_skips_ + 1 : 0;
  result.consecutive_skips = consecutive_skips_;
  return result;
}

StepResult Engine::Impl::finish_step(StepResult result, const StepPlan& plan, const GradStats& total) {
  comm_.finish(compute_->record());  // the updates ran
  if (o_.optimizer_in_backward && total.non_finite) {
    MP_THROW(NumericError, "step ", steps_run_, ": non-finite gradients reached the update with ",
             "sharding.optimizer_in_backward (nothing can skip the step there); turn it off to skip such steps");
  }
  result.loss = mean_loss(losses_.as<double>(), o_.micro_batches);
  result.grad_norm = plan.grad_norm;
  result.skipped = plan.skip;
  result.loss_scale = o_.precision.loss_scaling == LossScalingMode::kStatic ? o_.precision.static_loss_scale
                                                                             : plan.loss_scale;
  result.lr = plan.lr;
  result.param_cast_elements = gathers_->cast_elements() - casts_before_;
  for (const auto& [before, after] : compute_spans_) timings_.compute_s += elapsed_seconds(before, after);
  timings_.update_s = elapsed_seconds(stats_begin_, stats_end_) + elapsed_seconds(update_begin_, update_end_);
  timings_.exposed_comm_s = comm_.exposed_s();
  timings_.total_s = seconds(step_start_);
  result.timings = timings_;
  if (plan.skip) stop_if_needed(result);
  return result;
}

// A skipped step: every rank took the same decision from the same exchanged
// flag, so every rank stops here together, with the weights of the last step.
void Engine::Impl::stop_if_needed(const StepResult& result) const {
  const std::string where =
      result.non_finite_rank >= 0
          ? detail::str("first from rank ", result.non_finite_rank, ", unit ", layout_.unit(result.non_finite_unit).name)
          : o_.locate_non_finite ? std::string("in the reduction (every rank's own gradients were finite)")
                                 : std::string("rank and unit not located (engine.locate_non_finite names them)");
  if (o_.stop_on_non_finite && o_.precision.loss_scaling == LossScalingMode::kNone) {
    MP_THROW_AGREED(NumericError, "step ", steps_run_, ": non-finite gradients, ", where,
                    "; stopping (non_finite = NON_FINITE_STOP): weights and moments are those after step ",
                    steps_run_ - 1);
  }
  if (consecutive_skips_ >= o_.max_consecutive_skips) {
    MP_THROW_AGREED(NumericError, "step ", steps_run_, ": ", consecutive_skips_,
                    " steps in a row had non-finite gradients (", where,
                    " this time); stopping (max_consecutive_skips = ", o_.max_consecutive_skips, ")");
  }
}

// The mean of every rank's micro-batch losses (losses[m] is this rank's
// m-th), summed in the order of their global index m * W + r, so it does not
// depend on the world size. Collective over the world.
double Engine::Impl::mean_loss(const double* losses, int count) {
  const size_t k = static_cast<size_t>(count), W = static_cast<size_t>(world_.size());
  const std::vector<double> all = world_.all_gather_double(std::span<const double>(losses, k));
  double loss = 0;
  for (size_t m = 0; m < k; ++m) {
    for (size_t j = 0; j < W; ++j) loss += all[j * k + m];
  }
  return loss / static_cast<double>(W * k);
}

// Note [A failed step] in runtime/engine.h: waits for `done` (not exposed
// communication), and every rank learns whether any rank's compute failed.
// A CommError (a collective timed out, a peer is gone) is thrown at once:
// the world cannot carry an agreement then, and waiting for one would only
// add a second timeout before the error that names the missing ranks.
void Engine::Impl::agree_on_compute(const std::string& what, const Event& done) {
  std::exception_ptr failed;
  try {
    comm_.finish(done);
    rethrow_stream_failures();
  } catch (const CommError&) {
    throw;
  } catch (...) {
    failed = std::current_exception();
  }
  world_.agree(what, [&] {
    if (failed) std::rethrow_exception(failed);
  });
}

void Engine::Impl::synchronize() {
  set_current_device(device_);  // before host staging too, which synchronizes first
  compute_->synchronize();
  shard_stream_->synchronize();
  replicate_stream_->synchronize();
}

void Engine::Impl::drain() noexcept {
  try {
    set_current_device(device_);
  } catch (...) {
  }
  for (Stream* s : {compute_.get(), shard_stream_, replicate_stream_}) {
    try {
      s->synchronize();
    } catch (...) {
      // A failure was reported where it was waited for.
    }
  }
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
  // Let issued collectives and tasks finish before their buffers go, on
  // every stream: after a failed step the communication threads still run
  // the step's collectives (Note [A failed step]) while the compute stream
  // rethrows its failure.
  impl_->drain();
}

const EngineOptions& Engine::options() const { return impl_->options(); }
const FlatLayout& Engine::layout() const { return impl_->layout(); }
const std::vector<bool>& Engine::recomputed() const { return impl_->recomputed(); }
const Optimizer& Engine::optimizer() const { return impl_->optimizer(); }
int Engine::shard_rank() const { return impl_->mesh().shard->rank(); }
MemStats Engine::memory() const { return impl_->allocator().stats(); }
MemoryPlan Engine::plan() const {
  return plan_memory(impl_->spec(), impl_->options(), impl_->mesh().shard->rank(), impl_->allocator().device());
}
// Where this rank was when a step failed: its device, the step and the last
// data-plane collective it issued, on whichever of its communicators.
std::string Engine::Impl::failure_context() const {
  const Communicator* latest = &world_;
  for (const Communicator* c : {mesh_.shard.get(), mesh_.replicate.get()}) {
    if (c != nullptr && c->last_issued_order() > latest->last_issued_order()) latest = c;
  }
  const std::string last = latest->last_issued();
  return detail::str("rank ", world_.rank(), " on ", to_string(device_), ", step ", steps_run_,
                     "; last collective issued: ", last.empty() ? std::string("none") : last);
}

void Engine::Impl::rethrow_stream_failures() const {
  for (Stream* s : {compute_.get(), shard_stream_, replicate_stream_}) {
    if (s != nullptr) s->rethrow_failure();
  }
}

// A device fault surfaces at whatever CUDA call comes next, and a stream
// task's failure at the next wait or engine call: both get where the rank
// was. Every other error already says what it needs.
template <class F>
auto Engine::Impl::call(F&& f) -> decltype(f()) {
  try {
    rethrow_stream_failures();
    return f();
  } catch (const Error& e) {
    if (!e.from_stream_task() && dynamic_cast<const CudaError*>(&e) == nullptr) throw;
    rethrow_with_context(std::current_exception(), " [" + failure_context() + "]");
  }
}

StepResult Engine::step(Model& model) {
  return impl_->call([&] { return impl_->step(model); });
}
Stream& Engine::compute() { return impl_->compute(); }
void Engine::wait_compute() {
  impl_->call([&] { impl_->wait_compute(); });
}
Tensor Engine::unshard(int unit, Pass pass) {
  return impl_->call([&] { return impl_->unshard(unit, pass); });
}
void Engine::reshard(int unit) {
  impl_->call([&] { impl_->reshard(unit); });
}
bool Engine::unsharded(int unit) const { return impl_->unsharded(unit); }
Tensor Engine::gradient_buffer(int unit) {
  return impl_->call([&] { return impl_->gradient_buffer(unit); });
}
void Engine::reduce_gradients(int unit) {
  impl_->call([&] { impl_->reduce_gradients(unit); });
}
void Engine::note_loss(double loss) {
  impl_->call([&] { impl_->note_loss(loss); });
}
double Engine::loss_scale() const {
  const EngineOptions& o = impl_->options();
  if (o.precision.loss_scaling == LossScalingMode::kStatic) return o.precision.static_loss_scale;
  const LossScaler* scaler = impl_->optimizer().loss_scaler();
  return scaler != nullptr ? scaler->scale() : 1.0;
}
void Engine::set_lr(double lr) {
  impl_->call([&] { impl_->optimizer().set_lr(lr); });
}
StepResult Engine::finish_step() {
  return impl_->call([&] { return impl_->finish_step(); });
}
double Engine::evaluate(Model& model, int64_t first, int count) {
  return impl_->call([&] { return impl_->evaluate(model, first, count); });
}
std::vector<float> Engine::master_shard(int unit) const {
  return impl_->call([&] { return impl_->master_shard(unit); });
}
std::vector<float> Engine::gather_master(int unit) {
  return impl_->call([&] { return impl_->gather_master(unit); });
}
void Engine::set_weights(int unit, std::span<const float> full) {
  impl_->call([&] { impl_->set_weights(unit, full); });
}

}  // namespace mp

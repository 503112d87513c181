// runtime/step_decision.h: a step's gradient statistics and the decision
// taken from them (clip, scale, skip), in one place for both schedules.
// Internal to the engine.
//
// Note [Statistics and decision]
// 1. Per unit, once its reductions have landed, GradStatistics::take_shard
//    enqueues one read of the reduced shard (ops::grad_stats) on the stream
//    that orders it: the fp64 sum of squares of the true gradient (the shard
//    times StepDecision::multiplier(), which undoes the loss scale and the
//    divisor) and whether anything is NaN or Inf, into a slot in the
//    engine's device memory. The compute stream takes them unit by unit
//    after each unit's reductions; with optimizer_in_backward the
//    communication stream does, just before the unit's update there.
// 2. read_back: one copy of every slot to the host, the step's only
//    device-to-host read (on the compute stream, after every take, into
//    pinned memory: cudaMemcpyAsync to pageable memory would block the host
//    until the stream got there, so a hung peer would hang the rank
//    silently). The host waits for it, bounded by the communicator's
//    timeout (Note [Engine waits] in runtime/comm_watch.h), then GradStatistics::total adds the units' sums in
//    unit order and makes one exchange over the shard group (replicas hold
//    the same shards): every rank's (sum, flag), summed in rank order on the
//    control plane (Note [Control plane]). Deterministic mode rounds the sum
//    to fp32, so the fp64 sum's order (which follows the sharding) does not
//    reach the clip coefficient.
// 3. StepDecision::decide: the plan, the only call of Optimizer::plan_step
//    of the step (which advances the counters and the loss scaler), on the
//    host. Normally from the total. With optimizer_in_backward the first
//    unit's update needs the plan before any statistics exist; the options
//    rule out clipping and loss scaling there, so the plan cannot depend on
//    them: it is decided from none (a zero sum, finite) at that first
//    update, and the total only supplies the reported norm (non-finite
//    gradients then raise NumericError after the step: nothing could skip
//    it). The plan's StepScalars are then copied to the device for the
//    fused updates (a host-to-device write, no wait).
// Why one read and not none: the skip decision, the loss scaler's update
// and the logged norm are needed on the host every step anyway, and the
// exchange between ranks is a control-plane (host) collective; a device-side
// plan would save one small copy per step and cost a second implementation
// of the optimizer's decision on the device.
// With locate_non_finite, GradStatistics::take_local also reads each unit's
// own fp32 gradients (before any reduction), every micro-batch; locate()
// finds the lowest rank with a non-finite one and that rank's first such
// unit in backward order.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/allocator.h"
#include "core/pinned.h"
#include "kernels/cpu/grad_stats.h"
#include "kernels/ops.h"
#include "optim/optimizer.h"

namespace mp {

class GradStatistics {
 public:
  // Slots in `alloc`'s device memory for every unit (and, locating, every
  // unit of every micro-batch).
  GradStatistics(int num_units, int micro_batches, bool locate_non_finite, Allocator& alloc);

  // Enqueues on `s` the statistics of this rank's fp32 gradients of unit u
  // in micro-batch m (numel elements), before reduction (locating only).
  void take_local(int u, int m, const Tensor& grads, int64_t numel, Stream& s);
  // Enqueues on `s` the statistics of unit u's reduced shard (n elements)
  // times `multiplier`. Once per unit and step, before read_back.
  // With `round`, the shard is first rounded in place (GradReducer::local_rounding).
  void take_shard(int u, const Tensor& grad_shard, int64_t n, float multiplier, Stream& s,
                  std::optional<ops::RoundThrough> round = std::nullopt);
  // Enqueues on `s` the copy of every slot to the host, after the takes
  // (ordered on or before s); returns the event to wait for.
  Event read_back(Stream& s);
  // After read_back's event: the global statistics of the step. Collective
  // over `shard_group` (when it has more than one rank).
  GradStats total(Communicator& shard_group, bool deterministic) const;
  // After read_back's event: the lowest rank whose own gradients were not
  // finite this step, and its first such unit; (-1, -1) if none. Collective
  // over `world`.
  std::pair<int, int> locate(Communicator& world) const;

 private:
  int num_units_ = 0;
  int micro_batches_ = 1;
  bool locate_ = false;
  Device device_;
  int64_t workspace_bytes_ = 0;
  Buffer slots_;       // ops::GradStatsSlot [units + micro_batches x units when locating], device
  Buffer workspace_;   // one workspace per slot (ops::grad_stats), device
  // read_back's copy: pinned for a device, so the copy never blocks the
  // host and the wait for it stays bounded (a hung peer is named).
  PinnedBuffer host_;
  size_t count_ = 0;  // slots
  const ops::GradStatsSlot& host_slot(size_t i) const { return host_.as<const ops::GradStatsSlot>()[i]; }
};

class StepDecision {
 public:
  StepDecision(Optimizer& opt, bool optimizer_in_backward) : opt_(opt), in_backward_(optimizer_in_backward) {}

  // A new step, whose reduced gradients carry `divisor` (GradReducer::divisor).
  void begin(double divisor);
  // What statistics multiply the reduced gradient by: 1 / (loss scale x
  // divisor), in fp32. (With optimizer_in_backward, which has neither
  // clipping nor loss scaling, it equals the plan's grad_multiplier.)
  float multiplier() const { return multiplier_; }
  // The step's plan from its global statistics, or null: decided before
  // them (optimizer_in_backward only). See Note [Statistics and decision].
  const StepPlan& decide(const GradStats* total);

 private:
  Optimizer& opt_;
  const bool in_backward_;
  double divisor_ = 1;
  float multiplier_ = 1;
  bool decided_ = false;
  StepPlan plan_;
};

}  // namespace mp

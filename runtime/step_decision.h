// runtime/step_decision.h: a step's gradient statistics and the decision
// taken from them (clip, scale, skip), in one place for both schedules.
// Internal to the engine.
//
// Note [Statistics and decision]
// 1. Per unit, once its reductions have landed, GradStatistics::take_shard
//    reads the reduced shard once: the fp64 sum of squares of the true
//    gradient (the shard times StepDecision::multiplier(), which undoes the
//    loss scale and the divisor) and whether anything is NaN or Inf. The
//    engine calls it on the compute thread, unit by unit after each unit's
//    wait; with optimizer_in_backward on the communication thread, just
//    before the unit's update there.
// 2. GradStatistics::total: the units' sums added in unit order, then one
//    exchange over the shard group (replicas hold the same shards): every
//    rank's (sum, flag), summed in rank order on the control plane (Note
//    [Control plane]). Deterministic mode rounds the sum to fp32, so the
//    fp64 sum's order (which follows the sharding) does not reach the clip
//    coefficient.
// 3. StepDecision::decide: the plan, the only call of Optimizer::plan_step
//    of the step (which advances the counters and the loss scaler).
//    Normally from the total. With optimizer_in_backward the first unit's
//    update needs the plan before any statistics exist; the options rule
//    out clipping and loss scaling there, so the plan cannot depend on them:
//    it is decided from none (a zero sum, finite) at that first update, and
//    the total only supplies the reported norm (non-finite gradients then
//    raise NumericError after the step: nothing could skip it).
// With locate_non_finite, GradStatistics::take_local also reads each unit's
// own fp32 gradients (before any reduction) until the first non-finite
// unit of this rank is found; locate() finds the lowest such rank.
#pragma once

#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "kernels/cpu/grad_stats.h"
#include "optim/optimizer.h"

namespace mp {

class GradStatistics {
 public:
  GradStatistics(int num_units, bool locate_non_finite);

  void begin_step();
  // This rank's fp32 gradients of unit u (numel elements), before reduction.
  void take_local(int u, const Tensor& grads, int64_t numel);
  // Unit u's reduced shard (n elements) times `multiplier`. Once per unit
  // and step, on any thread, before total() (which must be ordered after it).
  void take_shard(int u, const Tensor& grad_shard, int64_t n, float multiplier);
  // The global statistics of the step. Collective over `shard_group` (when
  // it has more than one rank).
  GradStats total(Communicator& shard_group, bool deterministic) const;
  // The lowest rank whose own gradients were not finite this step, and its
  // first such unit; (-1, -1) if none. Collective over `world`.
  std::pair<int, int> locate(Communicator& world) const;

 private:
  std::vector<GradStats> shards_;  // this step's, per unit
  bool locate_ = false;
  int first_bad_unit_ = -1;        // this step: the first unit whose local gradients were not finite
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

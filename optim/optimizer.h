// optim/optimizer.h: an optimizer built from OptimizerConfig (proto/
// mp.proto): hyperparameters, learning-rate schedule, global-norm
// clipping, dynamic loss scaling, parameter groups, and the step counter.
// It decides each step; the fused kernels (kernels/cpu/update.h,
// kernels/cuda/update_cuda.h) apply it to every shard in one pass.
//
// A step, on every rank:
//   1. stats = grad_stats_cpu(grad, dtype, n, opt.unscale_multiplier(divisor))
//      per shard: the sum of squares of the true (unscaled, averaged)
//      gradient and whether anything is NaN or Inf;
//   2. all-reduce (sum of sum_sq, max of non_finite) across the ranks;
//   3. plan = opt.plan_step(global_sum_sq, found_inf, divisor): the same
//      decision on every rank;
//   4. the fused update of every shard with the plan's scalars
//      (fused_update_cpu, or ops::fused_update in kernels/ops.h with them in
//      device memory); a skipped step writes nothing.
// Skipped steps (found_inf) do not advance the step counter, the bias
// correction or the learning-rate schedule, as in DeepSpeed.
//
// The kind is its entry (Note [Optimizer kinds] in optim/optimizer_kind.h);
// with whole matrices (MUON), muon() holds their settings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/update_args.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer_kind.h"
#include "optim/schedule.h"

namespace mp {

struct ParamGroup {
  std::string name_regex;
  double lr_scale = 1.0;
  double weight_decay_scale = 1.0;
};

// A parameter's place in a flat shard, for the range table.
struct ShardParam {
  std::string name;
  int64_t begin = 0;  // within the shard
  int64_t end = 0;
  int ndim = 2;       // 1-D parameters (biases, norms) are not decayed by default
  bool skip = false;  // the fused update leaves it alone (UpdateRange::skip)
};

// What a step does, identical on every rank.
struct StepPlan {
  bool skip = false;             // found_inf: nothing is written
  double grad_norm = 0.0;        // global L2 norm of the true gradient (NaN when non-finite)
  double clip_coefficient = 1.0;
  double loss_scale = 1.0;       // the scale this step's gradients carry
  double lr = 0.0;               // scheduled
  StepScalars scalars;           // what the fused update reads (its lr: Optimizer::element_lr)
};

class Optimizer {
 public:
  // Throws ConfigError naming the field ("optimizer.beta2 = 1.5: ...").
  explicit Optimizer(const proto::OptimizerConfig& config);

  const OptimizerKind& kind() const { return *kind_.kind; }
  // The fused update's rule and hyperparameters; for MUON those of its AdamW.
  const OptimizerHyper& hyper() const { return kind_.hyper; }
  // A kind with whole matrices (MUON): their settings; otherwise null.
  const MuonSettings* muon() const { return kind_.muon ? &*kind_.muon : nullptr; }
  // The fused update's lr (StepPlan::scalars) for a step scheduled at
  // scheduled_lr: that lr, or with whole matrices (whose lr it is) the
  // rule's own (muon.adamw_lr) times the schedule's factor scheduled_lr /
  // lr (1 when lr is 0).
  double element_lr(double scheduled_lr) const;
  const LrSchedule& schedule() const { return schedule_; }
  double grad_clip() const { return grad_clip_; }
  bool loss_scaling() const { return scaler_.has_value(); }
  const LossScaler* loss_scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  // State arrays per element: the rule's (MUON: its AdamW's 2; its
  // matrices keep the first, their momentum buffer).
  int state_count() const { return math::rule_states(kind_.hyper.rule); }

  // Completed (not skipped) steps.
  int64_t steps_done() const { return steps_done_; }
  int64_t steps_skipped() const { return steps_skipped_; }
  // Multiplier from the reduced gradient to the true one: 1 / (loss scale x divisor).
  double unscale_multiplier(double divisor) const;

  // Decides the step from the globally reduced statistics and advances the
  // counters and the loss scaler. `divisor`: what the reduced gradient is
  // still to be divided by (1 when the reduction averaged).
  StepPlan plan_step(double global_sum_sq, bool found_inf, double divisor = 1.0);

  // The range table of a shard from its parameters: each parameter's
  // group (first matching pattern) and the 1-D rule; gaps (padding) join
  // the range before them; neighbours with equal scales merge. Throws
  // ConfigError for overlapping or unsorted parameters.
  std::vector<UpdateRange> ranges_for(const std::vector<ShardParam>& params, int64_t shard_numel) const;

  // The checkpointed state (runtime/checkpoint.h).
  void restore_counters(int64_t steps_done, int64_t steps_skipped) {
    steps_done_ = steps_done;
    steps_skipped_ = steps_skipped;
  }
  void restore_loss_scaler(const LossScaler::State& s) {
    if (scaler_) scaler_->restore(s);
  }
  // The lr of every later step, in place of the schedule (as a torch
  // user's param_group["lr"] = lr); ConfigError unless finite and >= 0.
  void set_lr(double lr);

 private:
  KindConfig kind_;
  LrSchedule schedule_;
  double grad_clip_ = 0.0;
  std::optional<LossScaler> scaler_;
  bool weight_decay_1d_ = false;
  std::vector<ParamGroup> groups_;
  int64_t steps_done_ = 0;
  int64_t steps_skipped_ = 0;
};

// Sets the table's state1_shift (UpdateRange) so that AdamW's second moment
// is kept for the updated ranges only: each run of skipped elements (Muon's
// matrices, with their padding) is left out of state1 but for its length
// modulo 64. Returns the elements state1 then needs: the shard's own when
// nothing is skipped.
int64_t compact_state1(std::vector<UpdateRange>& ranges, int64_t shard_numel);
// The same count for a shard's parameters, whatever their groups (the
// memory plan's).
int64_t compact_state1_numel(const std::vector<ShardParam>& params, int64_t shard_numel);

}  // namespace mp

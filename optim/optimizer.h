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
//   4. opt.apply_cpu(shard_args, plan) for every shard (a skipped step
//      writes nothing); the engine instead enqueues ops::fused_update
//      (kernels/ops.h) with the plan's scalars in device memory.
// Skipped steps (found_inf) do not advance the step counter, the bias
// correction or the learning-rate schedule, as in DeepSpeed.
//
// Kind MUON: hyper() is the AdamW of the parameters Muon does not take
// (muon()->adamw), and muon() holds the matrices' settings for
// muon_step_cpu (optim/muon.h); the engine runs Muon on its matrices
// (runtime/muon_exchange.h) and this AdamW, at adamw_lr, on the rest.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/update_args.h"
#include "optim/loss_scaler.h"
#include "optim/muon.h"
#include "optim/schedule.h"
#include "proto/mp.pb.h"

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
  double lr = 0.0;
  StepScalars scalars;           // what the kernels read
};

class Optimizer {
 public:
  // Throws ConfigError naming the field ("optimizer.beta2 = 1.5: ...").
  explicit Optimizer(const proto::OptimizerConfig& config);

  // The fused update's hyperparameters; for MUON those of its AdamW.
  const OptimizerHyper& hyper() const { return hyper_; }
  // Kind MUON: its settings; otherwise null.
  const MuonSettings* muon() const { return muon_ ? &*muon_ : nullptr; }
  // Kind MUON: the AdamW parameters' lr for a step whose (Muon) lr is
  // scheduled_lr: adamw_lr x scheduled_lr / lr, the schedule's factor (1
  // when lr is 0).
  double adamw_lr(double scheduled_lr) const;
  const LrSchedule& schedule() const { return schedule_; }
  double grad_clip() const { return grad_clip_; }
  bool loss_scaling() const { return scaler_.has_value(); }
  const LossScaler* loss_scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  // Moment arrays per parameter: AdamW 2, Lion 1, SGD 1 with momentum else 0;
  // MUON 2 (its AdamW's; a Muon matrix has 1, its momentum buffer).
  int state_count() const;

  // Completed (not skipped) steps.
  int64_t steps_done() const { return steps_done_; }
  int64_t steps_skipped() const { return steps_skipped_; }
  // Multiplier from the reduced gradient to the true one: 1 / (loss scale x divisor).
  double unscale_multiplier(double divisor) const;

  // Decides the step from the globally reduced statistics and advances the
  // counters and the loss scaler. `divisor`: what the reduced gradient is
  // still to be divided by (1 when the reduction averaged).
  StepPlan plan_step(double global_sum_sq, bool found_inf, double divisor = 1.0);

  // Applies a plan to one shard: args carries the shard's arrays; hyper is
  // set here. A skipped plan writes nothing.
  void apply_cpu(UpdateArgs args, const StepPlan& plan) const;

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
  OptimizerHyper hyper_;
  std::optional<MuonSettings> muon_;
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

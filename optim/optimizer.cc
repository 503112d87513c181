#include "optim/optimizer.h"

#include <cmath>
#include <regex>

#include "core/error.h"

namespace mp {

Optimizer::Optimizer(const proto::OptimizerConfig& c) : kind_(configure_kind(c)) {
  schedule_.lr = kind_.lr;
  schedule_.min_lr = c.schedule().min_lr();
  schedule_.warmup_steps = c.schedule().warmup_steps();
  schedule_.total_steps = c.schedule().total_steps();
  try {
    schedule_.validate();
  } catch (const ConfigError& e) {
    MP_THROW(ConfigError, "optimizer.schedule: ", e.message());
  }
  if (!std::isfinite(c.grad_clip()) || c.grad_clip() < 0) {
    MP_THROW(ConfigError, "optimizer.grad_clip = ", c.grad_clip(), ": must be >= 0 (0 turns clipping off)");
  }
  grad_clip_ = c.grad_clip();

  if (c.has_loss_scaling()) {
    const auto& l = c.loss_scaling();
    LossScalerOptions o;
    if (l.has_init_scale()) o.init_scale = l.init_scale();
    if (l.has_growth_factor()) o.growth_factor = l.growth_factor();
    if (l.has_backoff_factor()) o.backoff_factor = l.backoff_factor();
    if (l.has_growth_interval()) o.growth_interval = l.growth_interval();
    if (l.has_hysteresis()) o.hysteresis = l.hysteresis();
    if (l.has_min_scale()) o.min_scale = l.min_scale();
    try {
      scaler_.emplace(o);
    } catch (const ConfigError& e) {
      MP_THROW(ConfigError, "optimizer.", e.message());
    }
  }
  weight_decay_1d_ = c.weight_decay_1d();
  for (int k = 0; k < c.param_groups_size(); ++k) {
    const auto& g = c.param_groups(k);
    ParamGroup group{g.name_regex(), g.has_lr_scale() ? g.lr_scale() : 1.0,
                     g.has_weight_decay_scale() ? g.weight_decay_scale() : 1.0};
    try {
      std::regex check(group.name_regex);
    } catch (const std::regex_error& e) {
      MP_THROW(ConfigError, "optimizer.param_groups[", k, "].name_regex = '", group.name_regex,
               "': not a valid regular expression (", e.what(), ")");
    }
    if (!std::isfinite(group.lr_scale) || group.lr_scale < 0) {
      MP_THROW(ConfigError, "optimizer.param_groups[", k, "].lr_scale = ", group.lr_scale, ": must be >= 0");
    }
    if (!std::isfinite(group.weight_decay_scale) || group.weight_decay_scale < 0) {
      MP_THROW(ConfigError, "optimizer.param_groups[", k, "].weight_decay_scale = ", group.weight_decay_scale,
               ": must be >= 0");
    }
    groups_.push_back(group);
  }
}

double Optimizer::element_lr(double scheduled_lr) const {
  if (!kind_.muon) return scheduled_lr;
  const double peak = kind_.muon->adamw_lr;
  return schedule_.lr > 0 ? peak * (scheduled_lr / schedule_.lr) : peak;
}

double Optimizer::unscale_multiplier(double divisor) const {
  return 1.0 / ((scaler_ ? scaler_->scale() : 1.0) * divisor);
}

StepPlan Optimizer::plan_step(double global_sum_sq, bool found_inf, double divisor) {
  MP_ENFORCE(divisor > 0, "optimizer step with divisor ", divisor);
  StepPlan p;
  p.loss_scale = scaler_ ? scaler_->scale() : 1.0;
  found_inf = found_inf || !std::isfinite(global_sum_sq);
  p.grad_norm = found_inf ? std::nan("") : std::sqrt(global_sum_sq);
  p.skip = found_inf;
  if (scaler_) scaler_->update(found_inf);
  p.lr = schedule_.at(steps_done_);
  p.clip_coefficient = found_inf ? 1.0 : clip_coefficient(p.grad_norm, grad_clip_);
  p.scalars.lr = static_cast<float>(element_lr(p.lr));
  p.scalars.grad_multiplier = static_cast<float>(1.0 / (p.loss_scale * divisor) * p.clip_coefficient);
  p.scalars.step = steps_done_ + 1;
  p.scalars.found_inf = found_inf ? 1 : 0;
  if (found_inf) {
    ++steps_skipped_;
  } else {
    ++steps_done_;
  }
  return p;
}

namespace {

struct Scales {
  float lr = 1.0f, weight_decay = 1.0f;
};

// The range table of ranges_for, each parameter's scales from `scales`.
template <class ScalesOf>
std::vector<UpdateRange> range_table(const std::vector<ShardParam>& params, int64_t shard_numel, ScalesOf scales) {
  std::vector<UpdateRange> out;
  auto add = [&](int64_t begin, int64_t end, Scales sc, int32_t skip) {
    if (begin >= end) return;
    if (!out.empty() && out.back().lr_scale == sc.lr && out.back().weight_decay_scale == sc.weight_decay &&
        out.back().skip == skip) {
      out.back().end = end;
    } else {
      out.push_back(UpdateRange{begin, end, sc.lr, sc.weight_decay, skip});
    }
  };
  int64_t at = 0;
  for (const ShardParam& p : params) {
    if (p.begin < at || p.end < p.begin || p.end > shard_numel) {
      MP_THROW(ConfigError, "parameter '", p.name, "' at [", p.begin, ", ", p.end,
               ") overlaps the one before it, is unsorted or leaves the shard of ", shard_numel, " elements");
    }
    if (p.begin == p.end) continue;
    // Padding before a parameter joins the range before it; padding at the
    // start of the shard joins the first parameter's range.
    const int64_t from = out.empty() ? 0 : p.begin;
    if (!out.empty()) out.back().end = p.begin;
    add(from, p.end, scales(p), p.skip ? 1 : 0);
    at = p.end;
  }
  if (out.empty()) {
    if (shard_numel > 0) out.push_back(UpdateRange{0, shard_numel, 1.0f, 1.0f});
  } else {
    out.back().end = shard_numel;
  }
  return out;
}

}  // namespace

std::vector<UpdateRange> Optimizer::ranges_for(const std::vector<ShardParam>& params, int64_t shard_numel) const {
  std::vector<std::regex> patterns;
  for (const auto& g : groups_) patterns.emplace_back(g.name_regex);
  return range_table(params, shard_numel, [&](const ShardParam& p) {
    double lr_scale = 1.0, wd_scale = (p.ndim <= 1 && !weight_decay_1d_) ? 0.0 : 1.0;
    for (size_t k = 0; k < groups_.size(); ++k) {
      if (std::regex_match(p.name, patterns[k])) {
        lr_scale = groups_[k].lr_scale;
        wd_scale *= groups_[k].weight_decay_scale;
        break;
      }
    }
    return Scales{static_cast<float>(lr_scale), static_cast<float>(wd_scale)};
  });
}

int64_t compact_state1(std::vector<UpdateRange>& ranges, int64_t shard_numel) {
  int64_t shift = 0, run = 0;  // run: the skipped elements since the last updated range
  for (UpdateRange& r : ranges) {
    if (r.skip != 0) {
      r.state1_shift = shift;
      run += r.end - r.begin;
      continue;
    }
    shift += run / 64 * 64;
    run = 0;
    r.state1_shift = shift;
  }
  return shard_numel - shift - run / 64 * 64;
}

int64_t compact_state1_numel(const std::vector<ShardParam>& params, int64_t shard_numel) {
  std::vector<UpdateRange> table = range_table(params, shard_numel, [](const ShardParam&) { return Scales{}; });
  return compact_state1(table, shard_numel);
}

void Optimizer::set_lr(double lr) {
  if (!std::isfinite(lr) || lr < 0) MP_THROW(ConfigError, "set_lr(", lr, "): the lr must be finite and >= 0");
  schedule_ = LrSchedule{.lr = lr};
}

}  // namespace mp

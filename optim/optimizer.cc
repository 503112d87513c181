#include "optim/optimizer.h"

#include <cmath>
#include <regex>

#include "core/error.h"
#include "kernels/cpu/update.h"

namespace mp {
namespace {

void check_range(double v, double lo, double hi, bool hi_open, const char* field) {
  const bool ok = std::isfinite(v) && v >= lo && (hi_open ? v < hi : v <= hi);
  if (!ok) {
    MP_THROW(ConfigError, "optimizer.", field, " = ", v, ": must be in [", lo, ", ", hi, hi_open ? ")" : "]");
  }
}

// Kind MUON's settings (proto/mp.proto MuonConfig): torch.optim.Muon's and
// torch.optim.AdamW's defaults for unset fields.
MuonSettings muon_settings(const proto::MuonConfig& m, double weight_decay) {
  MuonSettings out;
  MuonHyper& h = out.hyper;
  out.weight_decay = weight_decay;
  if (m.has_momentum()) h.momentum = m.momentum();
  check_range(h.momentum, 0, 1, true, "muon.momentum");
  if (m.has_nesterov()) h.nesterov = m.nesterov();
  if (m.ns_coefficients_size() != 0) {
    if (m.ns_coefficients_size() != 3) {
      MP_THROW(ConfigError, "optimizer.muon.ns_coefficients: ", m.ns_coefficients_size(),
               " values; need exactly 3 (a, b, c), or none for the defaults");
    }
    for (int k = 0; k < 3; ++k) {
      if (!std::isfinite(m.ns_coefficients(k))) {
        MP_THROW(ConfigError, "optimizer.muon.ns_coefficients[", k, "] = ", m.ns_coefficients(k), ": must be finite");
      }
    }
    h.ns_a = m.ns_coefficients(0);
    h.ns_b = m.ns_coefficients(1);
    h.ns_c = m.ns_coefficients(2);
  }
  if (m.has_ns_steps()) h.ns_steps = m.ns_steps();
  if (h.ns_steps < 1 || h.ns_steps >= 100) {
    MP_THROW(ConfigError, "optimizer.muon.ns_steps = ", h.ns_steps, ": must be in [1, 100)");
  }
  if (m.has_eps()) h.eps = m.eps();
  if (!std::isfinite(h.eps) || h.eps <= 0) MP_THROW(ConfigError, "optimizer.muon.eps = ", h.eps, ": must be > 0");
  switch (m.adjust_lr_fn()) {
    case proto::MuonConfig::ORIGINAL: h.adjust_lr = MuonAdjustLr::kOriginal; break;
    case proto::MuonConfig::MATCH_RMS_ADAMW: h.adjust_lr = MuonAdjustLr::kMatchRmsAdamW; break;
    case proto::MuonConfig::SPECTRAL_UNCLAMPED: h.adjust_lr = MuonAdjustLr::kSpectralUnclamped; break;
    default:
      MP_THROW(ConfigError, "optimizer.muon.adjust_lr_fn = ", static_cast<int>(m.adjust_lr_fn()),
               ": unknown (ORIGINAL, MATCH_RMS_ADAMW or SPECTRAL_UNCLAMPED)");
  }
  switch (m.iteration_dtype()) {
    case proto::DATA_TYPE_UNSET:
    case proto::BF16: h.iteration_dtype = DType::kBF16; break;
    case proto::FP32: h.iteration_dtype = DType::kF32; break;
    default:
      MP_THROW(ConfigError, "optimizer.muon.iteration_dtype = ", proto::DataType_Name(m.iteration_dtype()),
               ": must be FP32 or BF16");
  }
  out.adamw.kind = OptimizerKind::kAdamW;
  out.adamw_lr = m.has_adamw_lr() ? m.adamw_lr() : 1e-3;
  const double beta1 = m.has_adamw_beta1() ? m.adamw_beta1() : 0.9;
  const double beta2 = m.has_adamw_beta2() ? m.adamw_beta2() : 0.999;
  const double eps = m.has_adamw_eps() ? m.adamw_eps() : 1e-8;
  const double wd = m.has_adamw_weight_decay() ? m.adamw_weight_decay() : 0.01;
  check_range(out.adamw_lr, 0, 10, false, "muon.adamw_lr");
  check_range(beta1, 0, 1, true, "muon.adamw_beta1");
  check_range(beta2, 0, 1, true, "muon.adamw_beta2");
  check_range(eps, 0, 1, false, "muon.adamw_eps");
  check_range(wd, 0, 1e3, false, "muon.adamw_weight_decay");
  out.adamw.beta1 = static_cast<float>(beta1);
  out.adamw.beta2 = static_cast<float>(beta2);
  out.adamw.eps = static_cast<float>(eps);
  out.adamw.weight_decay = static_cast<float>(wd);
  return out;
}

}  // namespace

Optimizer::Optimizer(const proto::OptimizerConfig& c) {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, wd = 0.0;
  const bool muon = c.kind() == proto::OptimizerConfig::MUON;
  if (c.has_muon() && !muon) {
    MP_THROW(ConfigError, "optimizer.muon: only for kind MUON (kind is ",
             proto::OptimizerConfig::Kind_Name(c.kind()), ")");
  }
  switch (c.kind()) {
    case proto::OptimizerConfig::ADAMW:
      hyper_.kind = OptimizerKind::kAdamW;
      wd = 0.01;
      break;
    case proto::OptimizerConfig::SGD: hyper_.kind = OptimizerKind::kSgd; break;
    case proto::OptimizerConfig::LION:
      hyper_.kind = OptimizerKind::kLion;
      lr = 1e-4;
      beta2 = 0.99;
      break;
    case proto::OptimizerConfig::MUON:
      hyper_.kind = OptimizerKind::kAdamW;  // the other parameters'; set below
      wd = 0.1;
      break;
    default: MP_THROW(ConfigError, "optimizer.kind = ", static_cast<int>(c.kind()), ": unknown optimizer");
  }
  const bool sgd = hyper_.kind == OptimizerKind::kSgd;
  if (sgd && (c.has_beta1() || c.has_beta2() || c.has_eps())) {
    MP_THROW(ConfigError, "optimizer: beta1, beta2 and eps are not SGD options (use momentum)");
  }
  if (muon && (c.has_beta1() || c.has_beta2() || c.has_eps())) {
    MP_THROW(ConfigError, "optimizer: beta1, beta2 and eps are not Muon options (its AdamW's are muon.adamw_beta1, ",
             "muon.adamw_beta2 and muon.adamw_eps)");
  }
  if (!sgd && (c.momentum() != 0 || c.dampening() != 0 || c.nesterov())) {
    MP_THROW(ConfigError, "optimizer: momentum, dampening and nesterov are SGD options",
             muon ? " (Muon's are muon.momentum and muon.nesterov)" : "");
  }
  if (hyper_.kind == OptimizerKind::kLion && c.has_eps()) MP_THROW(ConfigError, "optimizer.eps: Lion has no eps");
  if (c.has_lr()) lr = c.lr();
  if (c.has_beta1()) beta1 = c.beta1();
  if (c.has_beta2()) beta2 = c.beta2();
  if (c.has_weight_decay()) wd = c.weight_decay();
  check_range(lr, 0, 10, false, "lr");
  check_range(beta1, 0, 1, true, "beta1");
  check_range(beta2, 0, 1, true, "beta2");
  check_range(wd, 0, 1e3, false, "weight_decay");
  hyper_.beta1 = static_cast<float>(beta1);
  hyper_.beta2 = static_cast<float>(beta2);
  hyper_.weight_decay = static_cast<float>(wd);
  if (c.has_eps()) {
    check_range(c.eps(), 0, 1, false, "eps");
    hyper_.eps = static_cast<float>(c.eps());
  }
  check_range(c.momentum(), 0, 1, true, "momentum");
  check_range(c.dampening(), 0, 1, false, "dampening");
  hyper_.momentum = static_cast<float>(c.momentum());
  hyper_.dampening = static_cast<float>(c.dampening());
  hyper_.nesterov = c.nesterov();
  if (c.nesterov() && (c.momentum() <= 0 || c.dampening() != 0)) {
    MP_THROW(ConfigError, "optimizer.nesterov: needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
  }
  if (muon) {
    muon_ = muon_settings(c.muon(), wd);
    hyper_ = muon_->adamw;
  }

  schedule_.lr = lr;
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

double Optimizer::adamw_lr(double scheduled_lr) const {
  MP_ENFORCE(muon_.has_value(), "adamw_lr: the optimizer is not MUON");
  return schedule_.lr > 0 ? muon_->adamw_lr * (scheduled_lr / schedule_.lr) : muon_->adamw_lr;
}

int Optimizer::state_count() const {
  switch (hyper_.kind) {
    case OptimizerKind::kAdamW: return 2;
    case OptimizerKind::kLion: return 1;
    case OptimizerKind::kSgd: return hyper_.momentum != 0.0f ? 1 : 0;
  }
  return 0;
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
  p.scalars.lr = static_cast<float>(p.lr);
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

void Optimizer::apply_cpu(UpdateArgs args, const StepPlan& plan) const {
  args.hyper = hyper_;
  fused_update_cpu(args, plan.scalars);
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

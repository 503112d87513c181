// optim/optimizer_kind.cc: the table of optimizer kinds (Note [Optimizer
// kinds] in optim/optimizer_kind.h) and their configuration.
#include "optim/optimizer_kind.h"

#include <cmath>

#include "core/error.h"

namespace mp {
namespace {

using Config = proto::OptimizerConfig;

// v, once it is in [lo, hi] (or [lo, hi)); else a ConfigError naming the field.
double checked(double v, double lo, double hi, bool hi_open, const char* field) {
  const bool ok = std::isfinite(v) && v >= lo && (hi_open ? v < hi : v <= hi);
  if (!ok) {
    MP_THROW(ConfigError, "optimizer.", field, " = ", v, ": must be in [", lo, ", ", hi, hi_open ? ")" : "]");
  }
  return v;
}

// Muon's settings (proto/mp.proto MuonConfig): torch.optim.Muon's and
// torch.optim.AdamW's defaults for unset fields.
MuonSettings muon_settings(const proto::MuonConfig& m, double weight_decay) {
  MuonSettings out;
  MuonHyper& h = out.hyper;
  out.weight_decay = weight_decay;
  if (m.has_momentum()) h.momentum = checked(m.momentum(), 0, 1, true, "muon.momentum");
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
  out.adamw_lr = checked(m.has_adamw_lr() ? m.adamw_lr() : 1e-3, 0, 10, false, "muon.adamw_lr");
  OptimizerHyper& a = out.adamw;
  a.beta1 = static_cast<float>(checked(m.has_adamw_beta1() ? m.adamw_beta1() : 0.9, 0, 1, true, "muon.adamw_beta1"));
  a.beta2 = static_cast<float>(checked(m.has_adamw_beta2() ? m.adamw_beta2() : 0.999, 0, 1, true, "muon.adamw_beta2"));
  a.eps = static_cast<float>(checked(m.has_adamw_eps() ? m.adamw_eps() : 1e-8, 0, 1, false, "muon.adamw_eps"));
  a.weight_decay = static_cast<float>(
      checked(m.has_adamw_weight_decay() ? m.adamw_weight_decay() : 0.01, 0, 1e3, false, "muon.adamw_weight_decay"));
  return out;
}

// The table: kind, label, lr, beta1, beta2, weight_decay, reads, hint,
// rule, rule_without_momentum, matrices. Defaults: torch.optim.AdamW,
// torch.optim.SGD, Lion's paper, torch.optim.Muon. MUON: Muon on the marked
// matrices, AdamW (its rule) on every other parameter; lr and weight_decay
// are the matrices'.
using K = Config;
using R = UpdateRule;
constexpr const char* kMuonHint =
    " (its AdamW's are muon.adamw_beta1, muon.adamw_beta2 and muon.adamw_eps; Muon's are muon.momentum and "
    "muon.nesterov)";
constexpr OptimizerKind kKinds[] = {
    {K::ADAMW, "AdamW", 1e-3, 0.9,  0.999, 0.01, kBetas | kEps, "",        R::kAdamW,       R::kAdamW, nullptr},
    {K::SGD,   "SGD",   1e-3, 0.9,  0.999, 0.0,  kMomentum,     "",        R::kSgdMomentum, R::kSgd,   nullptr},
    {K::LION,  "Lion",  1e-4, 0.9,  0.99,  0.0,  kBetas,        "",        R::kLion,        R::kLion,  nullptr},
    {K::MUON,  "Muon",  1e-3, 0.9,  0.999, 0.1,  0,             kMuonHint, R::kAdamW,       R::kAdamW, muon_settings},
};

// "AdamW's and Lion's": the kinds that read `field`, or those with whole matrices (field 0).
std::string readers(unsigned field) {
  std::string out;
  for (const OptimizerKind& k : kKinds) {
    if (field != 0 ? (k.reads & field) == 0 : k.matrices == nullptr) continue;
    out += (out.empty() ? "" : " and ") + (field != 0 ? std::string(k.label) + "'s" : k.name());
  }
  return out;
}

const OptimizerKind& optimizer_kind(Config::Kind kind) {
  for (const OptimizerKind& k : kKinds) {
    if (k.kind == kind) return k;
  }
  MP_THROW(ConfigError, "optimizer.kind = ", static_cast<int>(kind), ": unknown optimizer");
}

}  // namespace

KindConfig configure_kind(const Config& c) {
  const OptimizerKind& k = optimizer_kind(c.kind());
  auto refuse = [&](bool set, unsigned field, const char* name) {
    if (set && (k.reads & field) == 0) {
      MP_THROW(ConfigError, "optimizer.", name, ": ", k.label, " has no ", name, "; it is ", readers(field), k.hint);
    }
  };
  refuse(c.has_beta1(), kBetas, "beta1");
  refuse(c.has_beta2(), kBetas, "beta2");
  refuse(c.has_eps(), kEps, "eps");
  refuse(c.momentum() != 0, kMomentum, "momentum");
  refuse(c.dampening() != 0, kMomentum, "dampening");
  refuse(c.nesterov(), kMomentum, "nesterov");
  if (c.has_muon() && k.matrices == nullptr) {
    MP_THROW(ConfigError, "optimizer.muon: only for kind ", readers(0), " (kind is ", k.name(), ")");
  }
  if (c.nesterov() && (c.momentum() <= 0 || c.dampening() != 0)) {
    MP_THROW(ConfigError, "optimizer.nesterov: needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
  }
  KindConfig out;
  out.kind = &k;
  out.lr = checked(c.has_lr() ? c.lr() : k.lr, 0, 10, false, "lr");
  OptimizerHyper& h = out.hyper;
  h.beta1 = static_cast<float>(checked(c.has_beta1() ? c.beta1() : k.beta1, 0, 1, true, "beta1"));
  h.beta2 = static_cast<float>(checked(c.has_beta2() ? c.beta2() : k.beta2, 0, 1, true, "beta2"));
  const double wd = checked(c.has_weight_decay() ? c.weight_decay() : k.weight_decay, 0, 1e3, false, "weight_decay");
  h.weight_decay = static_cast<float>(wd);
  if (c.has_eps()) h.eps = static_cast<float>(checked(c.eps(), 0, 1, false, "eps"));
  h.momentum = static_cast<float>(checked(c.momentum(), 0, 1, true, "momentum"));
  h.dampening = static_cast<float>(checked(c.dampening(), 0, 1, false, "dampening"));
  h.nesterov = c.nesterov();
  if (k.matrices != nullptr) {
    out.muon = k.matrices(c.muon(), wd);
    h = out.muon->adamw;
  }
  h.rule = h.momentum != 0.0f ? k.rule : k.rule_without_momentum;
  return out;
}

}  // namespace mp

#include "models/flat_layout.h"

#include <algorithm>

#include "core/error.h"

namespace mp {

int64_t ModelSpec::numel() const {
  int64_t total = 0;
  for (const UnitSpec& unit : units) {
    for (const ParamSpec& p : unit.params) total += shape_numel(p.shape);
  }
  return total;
}

std::vector<bool> recomputed_units(const ModelSpec& spec, int every) {
  MP_ENFORCE(every >= 0, "recomputed_units: k = ", every);
  std::vector<bool> recomputed(spec.units.size(), false);
  if (every == 0) return recomputed;
  int seen = 0;
  for (size_t u = 0; u < spec.units.size(); ++u) {
    if (spec.units[u].recomputable) recomputed[u] = seen++ % every == 0;
  }
  if (seen == 0) {
    MP_THROW(ConfigError, "activation_checkpointing is on, but the model can recompute none of its ",
             spec.units.size(), " units (UnitSpec::recomputable): turn it off for this model");
  }
  return recomputed;
}

FlatLayout::FlatLayout(const ModelSpec& spec, int group_size) : group_size_(group_size) {
  if (group_size < 1) MP_THROW(ConfigError, "shard group size ", group_size, ": must be at least 1");
  if (spec.units.empty()) MP_THROW(ConfigError, "model has no units");
  for (size_t u = 0; u < spec.units.size(); ++u) {
    const UnitSpec& us = spec.units[u];
    UnitLayout unit;
    unit.name = us.name.empty() ? "unit" + std::to_string(u) : us.name;
    unit.backward_reads_params = us.backward_reads_params;
    if (us.params.empty()) MP_THROW(ConfigError, "unit '", unit.name, "' has no parameters");
    int64_t offset = 0;
    for (size_t i = 0; i < us.params.size(); ++i) {
      const ParamSpec& ps = us.params[i];
      if (ps.name.empty()) MP_THROW(ConfigError, "unit '", unit.name, "': parameter ", i, " has no name");
      int64_t numel = 0;
      try {
        numel = shape_numel(ps.shape);
      } catch (const ConfigError& e) {
        MP_THROW(ConfigError, "parameter '", ps.name, "' shape ", shape_string(ps.shape), ": ", e.message());
      }
      if (numel == 0) MP_THROW(ConfigError, "parameter '", ps.name, "' has no elements");
      if (!index_.emplace(ps.name, std::make_pair(static_cast<int>(u), static_cast<int>(i))).second) {
        MP_THROW(ConfigError, "parameter name '", ps.name, "' appears twice");
      }
      offset = (offset + kParamAlignElements - 1) / kParamAlignElements * kParamAlignElements;
      unit.params.push_back(ParamPlacement{ps.name, ps.shape, ps.init, static_cast<int>(u), offset, numel, ps.muon,
                                           ps.muon_lr_a, ps.muon_lr_b});
      offset += numel;
    }
    unit.numel = offset;
    unit.padded_numel = (offset + group_size - 1) / group_size * group_size;
    unit.shard_numel = unit.padded_numel / group_size;
    units_.push_back(std::move(unit));
  }
  mark_oversized();
}

// Note [Oversized units]: by size, largest first (ties by index).
void FlatLayout::mark_oversized() {
  std::vector<size_t> order(units_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return units_[a].padded_numel > units_[b].padded_numel; });
  size_t best = 0;
  int64_t own = 0, best_cost = 2 * units_[order[0]].padded_numel;
  for (size_t m = 1; m < order.size(); ++m) {
    own += units_[order[m - 1]].padded_numel;
    if (own + 2 * units_[order[m]].padded_numel < best_cost) {
      best = m;
      best_cost = own + 2 * units_[order[m]].padded_numel;
    }
  }
  for (size_t m = 0; m < best; ++m) units_[order[m]].oversized = true;
}

const ParamPlacement& FlatLayout::param(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) MP_THROW(ConfigError, "no parameter named '", name, "'");
  return units_[static_cast<size_t>(it->second.first)].params[static_cast<size_t>(it->second.second)];
}

int64_t FlatLayout::max_padded_numel() const {
  int64_t m = 0;
  for (const UnitLayout& u : units_) m = std::max(m, u.padded_numel);
  return m;
}

int64_t FlatLayout::shared_padded_numel() const {
  int64_t m = 0;
  for (const UnitLayout& u : units_) {
    if (!u.oversized) m = std::max(m, u.padded_numel);
  }
  return m;
}

int FlatLayout::num_shared_units() const {
  int n = 0;
  for (const UnitLayout& u : units_) n += u.oversized ? 0 : 1;
  return n;
}

int64_t FlatLayout::max_shard_numel() const {
  int64_t m = 0;
  for (const UnitLayout& u : units_) m = std::max(m, u.shard_numel);
  return m;
}

int64_t FlatLayout::total_numel() const {
  int64_t total = 0;
  for (const UnitLayout& u : units_) {
    for (const ParamPlacement& p : u.params) total += p.numel;
  }
  return total;
}

}  // namespace mp

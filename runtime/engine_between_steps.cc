// runtime/engine_between_steps.cc: what Engine::Impl does between steps
// (runtime/engine_impl.h): forward-only evaluation, and each unit's weights
// read out and replaced. The step itself is engine.cc.
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "runtime/engine_impl.h"

namespace mp {

double Engine::Impl::evaluate(Model& model, int64_t first, int count) {
  MP_ENFORCE(count >= 1 && first >= 0, "evaluate: first ", first, ", count ", count);
  set_current_device(device_);
  const int W = world_.size(), r = world_.rank(), U = layout_.num_units();
  // A member, not a local: the queued copies write it (the engine outlives them).
  if (eval_losses_.size_bytes() < static_cast<size_t>(count) * sizeof(double)) {
    compute_->synchronize();  // no earlier evaluation's copy still writes the old slots
    eval_losses_ = PinnedBuffer(device_, static_cast<size_t>(count) * sizeof(double));
  }
  model.set_params_persist(gathers_->persistent());
  for (int j = 0; j < count; ++j) {
    model.begin_micro_batch_on(first + static_cast<int64_t>(j) * W + r, *compute_);
    for (int u = 0; u < U; ++u) {
      const Tensor params = gathers_->params_for(u, +1, *compute_);
      model.forward_on(u, params, *compute_);
      gathers_->release(u, compute_->record());
    }
    model.loss_on(eval_losses_.as<double>() + j, *compute_);
  }
  agree_on_compute("evaluation", compute_->record());
  return mean_loss(eval_losses_.as<double>(), count);
}

std::vector<float> Engine::Impl::master_shard(int u) const {
  set_current_device(device_);
  return unit(u).weights(*compute_);
}

// On the control plane: the shards are staged through the host anyway.
std::vector<float> Engine::Impl::gather_master(int u) {
  const std::vector<float> mine = master_shard(u);
  const std::vector<std::string> all =
      mesh_.shard->all_gather_bytes(std::string_view(reinterpret_cast<const char*>(mine.data()), mine.size() * 4));
  std::vector<float> full;
  full.reserve(mine.size() * all.size());
  for (const std::string& part : all) {
    MP_ENFORCE_EQ(part.size(), mine.size() * 4);
    const size_t at = full.size();
    full.resize(at + mine.size());
    std::memcpy(full.data() + at, part.data(), part.size());
  }
  full.resize(static_cast<size_t>(layout_.unit(u).numel));
  return full;
}

void Engine::Impl::set_weights(int u, std::span<const float> full) {
  const UnitLayout& ul = layout_.unit(u);
  if (static_cast<int64_t>(full.size()) != ul.numel) {
    MP_THROW(ConfigError, "set_weights of unit ", ul.name, ": ", full.size(), " values, the unit has ", ul.numel);
  }
  UnitState& unit = units_[static_cast<size_t>(u)];
  synchronize();  // no gather in flight still reads the old weights
  std::vector<float> mine(static_cast<size_t>(unit.n()), 0.0f);
  for (int64_t i = unit.offset(); i < std::min(unit.offset() + unit.n(), ul.numel); ++i) {
    mine[static_cast<size_t>(i - unit.offset())] = full[static_cast<size_t>(i)];
  }
  unit.set_weights(mine, *compute_);
  state_replaced();
}

void Engine::Impl::state_replaced() { gathers_->replaced(); }

}  // namespace mp

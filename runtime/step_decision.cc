#include "runtime/step_decision.h"

#include <cmath>

#include "core/error.h"

namespace mp {
namespace {

// Every read of gradients for statistics.
GradStats read_stats(const Tensor& grads, int64_t n, float multiplier) {
  return grad_stats_cpu(grads.data(), grads.dtype(), n, multiplier);
}

}  // namespace

GradStatistics::GradStatistics(int num_units, bool locate_non_finite)
    : shards_(static_cast<size_t>(num_units)), locate_(locate_non_finite) {}

void GradStatistics::begin_step() { first_bad_unit_ = -1; }

// Which rank and unit produced non-finite values, while it is still known
// (the reduction spreads them to every rank): one read of the unit's fp32
// gradients, until the first bad unit is found.
void GradStatistics::take_local(int u, const Tensor& grads, int64_t numel) {
  if (!locate_ || first_bad_unit_ >= 0) return;
  MP_ENFORCE(grads.dtype() == DType::kF32, "local gradients are fp32");
  if (read_stats(grads, numel, 1.0f).non_finite) first_bad_unit_ = u;
}

void GradStatistics::take_shard(int u, const Tensor& grad_shard, int64_t n, float multiplier) {
  shards_[static_cast<size_t>(u)] = read_stats(grad_shard, n, multiplier);
}

GradStats GradStatistics::total(Communicator& shard_group, bool deterministic) const {
  double sum_sq = 0;
  bool non_finite = false;
  for (const GradStats& s : shards_) {
    sum_sq += s.sum_sq;
    non_finite = non_finite || s.non_finite;
  }
  if (shard_group.size() > 1) {
    const double mine[2] = {sum_sq, non_finite ? 1.0 : 0.0};
    const std::vector<double> all = shard_group.all_gather_double(mine);
    sum_sq = 0;
    non_finite = false;
    for (size_t j = 0; j < all.size(); j += 2) {
      sum_sq += all[j];
      non_finite = non_finite || all[j + 1] != 0.0;
    }
  }
  if (deterministic) sum_sq = static_cast<double>(static_cast<float>(sum_sq));
  return GradStats{sum_sq, non_finite};
}

std::pair<int, int> GradStatistics::locate(Communicator& world) const {
  const int64_t mine = first_bad_unit_;
  const std::vector<int64_t> all = world.all_gather_int64(std::span<const int64_t>(&mine, 1));
  for (size_t j = 0; j < all.size(); ++j) {
    if (all[j] >= 0) return {static_cast<int>(j), static_cast<int>(all[j])};
  }
  return {-1, -1};
}

void StepDecision::begin(double divisor) {
  divisor_ = divisor;
  multiplier_ = static_cast<float>(opt_.unscale_multiplier(divisor));
  decided_ = false;
}

const StepPlan& StepDecision::decide(const GradStats* total) {
  MP_ENFORCE(total != nullptr || in_backward_, "a step is decided from its statistics");
  if (!decided_) {
    plan_ = total != nullptr && !in_backward_ ? opt_.plan_step(total->sum_sq, total->non_finite, divisor_)
                                              : opt_.plan_step(0.0, false, divisor_);
    decided_ = true;
  }
  if (total != nullptr && in_backward_) plan_.grad_norm = total->non_finite ? std::nan("") : std::sqrt(total->sum_sq);
  return plan_;
}

}  // namespace mp

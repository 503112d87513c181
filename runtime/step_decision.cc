#include "runtime/step_decision.h"

#include <cmath>

#include "core/error.h"

namespace mp {

GradStatistics::GradStatistics(int num_units, int micro_batches, bool locate_non_finite, Allocator& alloc)
    : num_units_(num_units),
      micro_batches_(micro_batches),
      locate_(locate_non_finite),
      device_(alloc.device()),
      workspace_bytes_(ops::grad_stats_workspace_bytes(alloc.device())) {
  const size_t count = static_cast<size_t>(num_units) * (locate_non_finite ? 1 + micro_batches : 1);
  slots_ = alloc.allocate(count * sizeof(ops::GradStatsSlot), MemCategory::kOther);
  workspace_ = alloc.allocate(count * static_cast<size_t>(workspace_bytes_), MemCategory::kOther);
  host_ = PinnedBuffer(device_, count * sizeof(ops::GradStatsSlot));
  count_ = count;
}

// Which rank and unit produced non-finite values, while it is still known
// (the reduction spreads them to every rank): one read of the unit's fp32
// gradients per micro-batch.
void GradStatistics::take_local(int u, int m, const Tensor& grads, int64_t numel, Stream& s) {
  if (!locate_) return;
  MP_ENFORCE(grads.dtype() == DType::kF32, "local gradients are fp32");
  const size_t slot = static_cast<size_t>(num_units_) * (1 + static_cast<size_t>(m)) + static_cast<size_t>(u);
  ops::grad_stats(grads, numel, 1.0f, static_cast<ops::GradStatsSlot*>(slots_.data()) + slot,
                  static_cast<char*>(workspace_.data()) + slot * static_cast<size_t>(workspace_bytes_), s);
}

void GradStatistics::take_shard(int u, const Tensor& grad_shard, int64_t n, float multiplier, Stream& s,
                                std::optional<ops::RoundThrough> round) {
  const size_t slot = static_cast<size_t>(u);
  ops::grad_stats(grad_shard, n, multiplier, static_cast<ops::GradStatsSlot*>(slots_.data()) + slot,
                  static_cast<char*>(workspace_.data()) + slot * static_cast<size_t>(workspace_bytes_), s, round);
}

Event GradStatistics::read_back(Stream& s) {
  ops::copy_bytes(host_.data(), Device::cpu(), slots_.data(), device_,
                  static_cast<int64_t>(count_ * sizeof(ops::GradStatsSlot)), s);
  return s.record();
}

GradStats GradStatistics::total(Communicator& shard_group, bool deterministic) const {
  double sum_sq = 0;
  bool non_finite = false;
  for (int u = 0; u < num_units_; ++u) {
    const ops::GradStatsSlot& s = host_slot(static_cast<size_t>(u));
    sum_sq += s.sum_sq;
    non_finite = non_finite || s.non_finite != 0;
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
  int64_t mine = -1;  // the first non-finite unit in backward order, micro-batch by micro-batch
  for (int m = 0; m < micro_batches_ && mine < 0; ++m) {
    for (int u = num_units_ - 1; u >= 0; --u) {
      if (host_slot(static_cast<size_t>(num_units_) * (1 + static_cast<size_t>(m)) + static_cast<size_t>(u)).non_finite) {
        mine = u;
        break;
      }
    }
  }
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

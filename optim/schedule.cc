#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace mp {

void LrSchedule::validate() const {
  if (!(lr >= 0) || !std::isfinite(lr)) MP_THROW(ConfigError, "lr_schedule.lr = ", lr, ": must be finite and >= 0");
  if (!(min_lr >= 0) || min_lr > lr) MP_THROW(ConfigError, "lr_schedule.min_lr = ", min_lr, ": must be in [0, lr]");
  if (warmup_steps < 0) MP_THROW(ConfigError, "lr_schedule.warmup_steps = ", warmup_steps, ": must be >= 0");
  if (total_steps != 0 && total_steps < warmup_steps) {
    MP_THROW(ConfigError, "lr_schedule.total_steps = ", total_steps, ": must be 0 (no decay) or >= warmup_steps (",
             warmup_steps, ")");
  }
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (total_steps == 0) return lr;
  if (step >= total_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

double clip_coefficient(double global_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  return std::min(1.0, max_norm / (global_norm + 1e-6));
}

}  // namespace mp

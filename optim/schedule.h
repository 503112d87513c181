// optim/schedule.h: the learning rate per step and the clip coefficient.
#pragma once

#include <cstdint>

namespace mp {

// Linear warmup from lr / warmup_steps to lr over warmup_steps, then cosine
// decay to min_lr at total_steps, min_lr after. warmup_steps = 0 and
// total_steps = 0 give a constant lr.
struct LrSchedule {
  double lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;

  // Throws ConfigError naming the bad field.
  void validate() const;
  double at(int64_t step) const;  // step counts from 0
};

// torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6)); 1 when
// clipping is off (max_norm <= 0).
double clip_coefficient(double global_norm, double max_norm);

}  // namespace mp

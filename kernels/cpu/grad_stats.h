// kernels/cpu/grad_stats.h: one read of a gradient shard that yields what
// global-norm clipping and loss scaling need: the sum of squares (fp64) of
// grad x multiplier, and whether any element is NaN or Inf. The ranks then
// all-reduce (sum_sq, non_finite) once per step.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mp {

struct GradStats {
  double sum_sq = 0.0;
  bool non_finite = false;
};

// A NaN or Inf anywhere sets non_finite (sum_sq is then meaningless).
GradStats grad_stats_cpu(const void* grad, DType dtype, int64_t n, float multiplier);

}  // namespace mp

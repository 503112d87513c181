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
// Multi-threaded (parallel_for) over fixed blocks of elements whose sums
// are added in order: the same bits for any thread count and ISA.
GradStats grad_stats_cpu(const void* grad, DType dtype, int64_t n, float multiplier);

// The same statistics after grad is rounded in place through `through`
// (fp32, bf16, fp16) with `divisor`, in one pass: grad[i] becomes
// convert()'s rounding of grad[i] / divisor into `through`, widened back
// (math::round_through_element), and the statistics are those of
// grad_stats_cpu on the rounded values.
GradStats grad_stats_round_cpu(float* grad, int64_t n, float multiplier, DType through, double divisor);

}  // namespace mp

#include "kernels/cpu/grad_stats.h"

#include "kernels/convert_math.h"
#include "core/error.h"

namespace mp {
namespace {

template <class T>
GradStats stats_loop(const T* g, int64_t n, float multiplier) {
  // Four fp64 partial sums and a NaN/Inf check by arithmetic (x - x is NaN
  // for NaN and Inf, 0 otherwise), so the loop vectorizes.
  double acc[4] = {0, 0, 0, 0};
  float bad = 0.0f;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) {
      const float x = math::to_f32(g[i + k]) * multiplier;
      bad += x - x;
      acc[k] += static_cast<double>(x) * x;
    }
  }
  for (; i < n; ++i) {
    const float x = math::to_f32(g[i]) * multiplier;
    bad += x - x;
    acc[0] += static_cast<double>(x) * x;
  }
  return GradStats{(acc[0] + acc[1]) + (acc[2] + acc[3]), bad != 0.0f};
}

}  // namespace

GradStats grad_stats_cpu(const void* grad, DType dtype, int64_t n, float multiplier) {
  MP_ENFORCE(!is_fp8(dtype), "gradient statistics of ", dtype_name(dtype), " are not supported");
  MP_ENFORCE(n == 0 || grad != nullptr, "gradient statistics of null memory");
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, fp8_e4m3> || std::is_same_v<T, fp8_e5m2>) {
      return GradStats{};  // unreachable: checked above
    } else {
      return stats_loop(static_cast<const T*>(grad), n, multiplier);
    }
  });
}

}  // namespace mp

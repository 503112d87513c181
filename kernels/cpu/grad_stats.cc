#include "kernels/cpu/grad_stats.h"

#include <algorithm>
#include <vector>

#include "kernels/convert_loop.h"
#include "kernels/convert_math.h"
#include "core/error.h"
#include "core/parallel.h"

namespace mp {
namespace {

// Elements per block: the sum of squares is summed block by block, each
// block's sum then added in block order, so the result does not depend on
// how many threads share the blocks.
constexpr int64_t kBlock = int64_t{1} << 16;

// One block: value(i) is element i (the rounding variant also writes it
// back). Four fp64 partial sums and a NaN/Inf check by arithmetic (x - x is
// NaN for NaN and Inf, 0 otherwise), so the loop vectorizes.
template <class Value>
GradStats block_stats(int64_t n, float multiplier, Value value) {
  double acc[4] = {0, 0, 0, 0};
  float bad = 0.0f;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) {
      const float x = value(i + k) * multiplier;
      bad += x - x;
      acc[k] += static_cast<double>(x) * x;
    }
  }
  for (; i < n; ++i) {
    const float x = value(i) * multiplier;
    bad += x - x;
    acc[0] += static_cast<double>(x) * x;
  }
  return GradStats{(acc[0] + acc[1]) + (acc[2] + acc[3]), bad != 0.0f};
}

// block(begin, count) for every block, in parallel; the sums added in order.
template <class Block>
GradStats blocked(int64_t n, Block block) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<GradStats> per_block(static_cast<size_t>(blocks));
  parallel_for(blocks, blocks < 4 ? 1 : 0, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t begin = b * kBlock;
      per_block[static_cast<size_t>(b)] = block(begin, std::min(kBlock, n - begin));
    }
  });
  GradStats total;
  for (const GradStats& s : per_block) {
    total.sum_sq += s.sum_sq;
    total.non_finite = total.non_finite || s.non_finite;
  }
  return total;
}

template <class T>
GradStats stats_loop(const T* g, int64_t n, float multiplier) {
  return blocked(n, [&](int64_t begin, int64_t count) {
    const T* b = g + begin;
    return block_stats(count, multiplier, [b](int64_t i) { return math::to_f32(b[i]); });
  });
}

// round_through_cpu's element math, then the statistics of what it wrote.
template <class W>
GradStats round_stats_loop(float* g, int64_t n, float multiplier, double divisor) {
  const math::ConvertParams p = math::make_convert_params(0, 0, 0, divisor);
  return blocked(n, [&](int64_t begin, int64_t count) {
    float* b = g + begin;
    if (divisor == 1.0) {  // convert_element's own path for it, as a loop that vectorizes
      return block_stats(count, multiplier, [b](int64_t i) { return b[i] = math::to_f32(math::from_f32<W>(b[i])); });
    }
    return block_stats(count, multiplier,
                       [b, &p](int64_t i) { return b[i] = math::round_through_element<W>(b[i], p); });
  });
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

GradStats grad_stats_round_cpu(float* grad, int64_t n, float multiplier, DType through, double divisor) {
  MP_ENFORCE(through == DType::kF32 || through == DType::kBF16 || through == DType::kF16,
             "gradient statistics rounding through ", dtype_name(through), ": fp32, bf16 or fp16 only");
  MP_ENFORCE(n == 0 || grad != nullptr, "gradient statistics of null memory");
  return dispatch_dtype(through, [&](auto tag) {
    using W = decltype(tag);
    if constexpr (std::is_same_v<W, float> || std::is_same_v<W, bf16> || std::is_same_v<W, fp16>) {
      return round_stats_loop<W>(grad, n, multiplier, divisor);
    } else {
      return GradStats{};  // unreachable: checked above
    }
  });
}

}  // namespace mp

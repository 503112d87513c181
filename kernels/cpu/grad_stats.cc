#include "kernels/cpu/grad_stats.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/convert_loop.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/cpu_isa.h"

namespace mp {
namespace {

// Elements per block: the sum of squares is summed block by block, each
// block's sum then added in block order, so the result does not depend on
// how many threads share the blocks.
constexpr int64_t kBlock = int64_t{1} << 16;

// One block: value(i) is element i (the rounding variant also writes it
// back). kLanes fp64 partial sums (independent chains, so the adds
// pipeline) and a NaN/Inf check by arithmetic (x - x is NaN for NaN and Inf,
// 0 otherwise), so the loop vectorizes; the lanes, not the vector width, fix
// the order, so every ISA clone below gives the same bits.
constexpr int kLanes = 16;

// Explicit vectors (GCC and clang vector extensions, lowered to whatever
// the ISA has), so the lanes are vector lanes in every build and clone.
typedef float F8 __attribute__((vector_size(32)));
typedef double D8 __attribute__((vector_size(64)));

template <class Value>
GradStats block_stats(int64_t n, float multiplier, Value value) {
  static_assert(kLanes == 16);
  D8 acc_lo = {}, acc_hi = {};  // lanes 0-7, 8-15
  F8 bad_lo = {}, bad_hi = {};  // 0, or NaN once a lane saw a NaN or Inf: any order gives the same answer
  const F8 m = {multiplier, multiplier, multiplier, multiplier, multiplier, multiplier, multiplier, multiplier};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    float xs[kLanes];
    for (int k = 0; k < kLanes; ++k) xs[k] = value(i + k);
    F8 lo, hi;
    std::memcpy(&lo, xs, sizeof(lo));
    std::memcpy(&hi, xs + 8, sizeof(hi));
    lo *= m;
    hi *= m;
    bad_lo += lo - lo;
    bad_hi += hi - hi;
    const D8 dlo = __builtin_convertvector(lo, D8), dhi = __builtin_convertvector(hi, D8);
    acc_lo += dlo * dlo;
    acc_hi += dhi * dhi;
  }
  double acc[kLanes];
  float bad[kLanes];
  std::memcpy(acc, &acc_lo, sizeof(acc_lo));
  std::memcpy(acc + 8, &acc_hi, sizeof(acc_hi));
  std::memcpy(bad, &bad_lo, sizeof(bad_lo));
  std::memcpy(bad + 8, &bad_hi, sizeof(bad_hi));
  for (; i < n; ++i) {
    const float x = value(i) * multiplier;
    bad[0] += x - x;
    acc[0] += static_cast<double>(x) * x;
  }
  for (int w = kLanes / 2; w >= 1; w /= 2) {  // pairwise, in a fixed order
    for (int k = 0; k < w; ++k) {
      acc[k] += acc[k + w];
      bad[k] += bad[k + w];
    }
  }
  return GradStats{acc[0], bad[0] != 0.0f};
}

// The hot blocks (fp32 and bf16 gradients; fp32 rounded through bf16 with
// no divisor, the one-rank bf16 path), compiled also for AVX2 and AVX-512
// (GCC and clang `target` attributes, the loop inlined into each) and
// picked at run time by cpu_isa_best(); -ffp-contract=off
// (kernels/CMakeLists.txt) keeps their bits the same. No ifunc: the loader
// resolves nothing (ifunc resolvers crash under the sanitizers).
struct StatsBlocks {
  GradStats (*f32)(const float* b, int64_t n, float multiplier);
  GradStats (*bf16_grad)(const bf16* b, int64_t n, float multiplier);
  GradStats (*f32_through_bf16)(float* b, int64_t n, float multiplier);
};

#define MP_STATS_BLOCKS(isa, attributes)                                                                    \
  attributes GradStats f32_block_##isa(const float* b, int64_t n, float multiplier) {                      \
    return block_stats(n, multiplier, [b](int64_t i) { return b[i]; });                                    \
  }                                                                                                         \
  attributes GradStats bf16_block_##isa(const bf16* b, int64_t n, float multiplier) {                      \
    return block_stats(n, multiplier, [b](int64_t i) { return math::to_f32(b[i]); });                      \
  }                                                                                                         \
  attributes GradStats f32_through_bf16_block_##isa(float* b, int64_t n, float multiplier) {               \
    return block_stats(n, multiplier, [b](int64_t i) { return b[i] = math::round_through_unit<bf16>(b[i]); }); \
  }                                                                                                         \
  constexpr StatsBlocks kStatsBlocks_##isa{&f32_block_##isa, &bf16_block_##isa, &f32_through_bf16_block_##isa};

MP_ISA_VARIANTS(MP_STATS_BLOCKS)
#undef MP_STATS_BLOCKS

const StatsBlocks& stats_blocks() { return MP_ISA_TABLE(kStatsBlocks); }

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
    if constexpr (std::is_same_v<T, float>) {
      return stats_blocks().f32(b, count, multiplier);
    } else if constexpr (std::is_same_v<T, bf16>) {
      return stats_blocks().bf16_grad(b, count, multiplier);
    } else {
      return block_stats(count, multiplier, [b](int64_t i) { return math::to_f32(b[i]); });
    }
  });
}

// convert()'s rounding through W (math::round_through_element), written back,
// then the statistics of what it wrote.
template <class W>
GradStats round_stats_loop(float* g, int64_t n, float multiplier, double divisor) {
  const math::ConvertParams p = math::make_convert_params(0, 0, 0, divisor);
  return blocked(n, [&](int64_t begin, int64_t count) {
    float* b = g + begin;
    if (divisor == 1.0) {  // convert_element's own path for it, as a loop that vectorizes
      if constexpr (std::is_same_v<W, bf16>) {
        return stats_blocks().f32_through_bf16(b, count, multiplier);
      } else {
        return block_stats(count, multiplier, [b](int64_t i) { return b[i] = math::round_through_unit<W>(b[i]); });
      }
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

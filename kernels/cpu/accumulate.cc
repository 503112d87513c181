#include "kernels/cpu/accumulate.h"

#include <type_traits>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/accumulate_math.h"

namespace mp {
namespace {

constexpr int64_t kGrain = 1 << 16;  // elements per thread below which one thread does it all

int threads_for(int64_t n) { return n < kGrain ? 1 : 0; }

template <class D, class S>
void accumulate_loop(D* dst, const S* src, int64_t n, bool overwrite) {
  parallel_for(n, threads_for(n), 64, [&](int64_t b, int64_t e) {
    // Two loops, so each has a constant `overwrite` and vectorizes.
    if (overwrite) {
      for (int64_t i = b; i < e; ++i) dst[i] = math::accumulate_into(dst[i], src[i], true);
    } else {
      for (int64_t i = b; i < e; ++i) dst[i] = math::accumulate_into(dst[i], src[i], false);
    }
  });
}

bool accumulable(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

}  // namespace

void accumulate_cpu(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n, bool overwrite) {
  MP_ENFORCE(accumulable(dst_dtype) && accumulable(src_dtype), "accumulate ", dtype_name(src_dtype), " into ",
             dtype_name(dst_dtype), ": fp32, bf16 or fp16 only");
  MP_ENFORCE(n >= 0 && (n == 0 || (dst != nullptr && src != nullptr)), "accumulate of ", n, " elements");
  dispatch_dtype(dst_dtype, [&](auto dtag) {
    using D = decltype(dtag);
    if constexpr (std::is_same_v<D, float> || std::is_same_v<D, bf16> || std::is_same_v<D, fp16>) {
      dispatch_dtype(src_dtype, [&](auto stag) {
        using S = decltype(stag);
        if constexpr (std::is_same_v<S, float> || std::is_same_v<S, bf16> || std::is_same_v<S, fp16>) {
          accumulate_loop(static_cast<D*>(dst), static_cast<const S*>(src), n, overwrite);
        }
      });
    }
  });
}

void accumulate_f64_cpu(double* acc, const float* src, int blocks, int64_t stride, int64_t n) {
  MP_ENFORCE(blocks >= 0 && n >= 0 && stride >= n, "fp64 accumulation of ", blocks, " blocks of ", n,
             " elements with stride ", stride);
  parallel_for(n, threads_for(n * blocks), 64, [&](int64_t b, int64_t e) {
    for (int k = 0; k < blocks; ++k) {
      const float* s = src + k * stride;
      for (int64_t i = b; i < e; ++i) acc[i] = math::add_f64(acc[i], s[i]);
    }
  });
}

void round_f64_cpu(const double* acc, float* out, int64_t n) {
  parallel_for(n, threads_for(n), 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = static_cast<float>(acc[i]);
  });
}

}  // namespace mp

// kernels/cpu/convert.cc: convert(): the CPU body, and on a stream the one
// dispatch (OpContext::run) to it or to the CUDA launcher.
#include "kernels/convert.h"

#include <type_traits>

#include "core/stream.h"
#include "kernels/convert_loop.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/dispatch.h"
#include "mp/config.h"
#if MP_WITH_CUDA
#include "kernels/cuda/convert_cuda.h"
#endif

namespace mp {
namespace {

// d = s rounded to Dst.
template <class Src, class Dst>
inline void plain_loop(const Src* s, Dst* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = math::from_f32<Dst>(math::to_f32(s[i]));
}

// d = s * inv rounded to Dst (Dst narrower than fp32, inv = 1 / a power of
// two). Returns nonzero when a product may be inexact in fp32 (zero or
// subnormal from a nonzero x, conservative), computed in integer operations
// so the loop vectorizes; then convert_cpu redoes the tensor element by
// element (convert_element).
template <class Src, class Dst>
inline uint32_t scaled_loop(const Src* s, Dst* d, int64_t n, float inv) {
  uint32_t inexact = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = math::to_f32(s[i]);
    const float q = x * inv;
    d[i] = math::from_f32<Dst>(q);
    const uint32_t bq = math::f32_bits(q), bx = math::f32_bits(x);
    inexact |= static_cast<uint32_t>((bq & 0x7f800000u) == 0u) & static_cast<uint32_t>((bx & 0x7fffffffu) != 0u);
  }
  return inexact;
}

// fp32 -> bf16, the gradients' cast to the wire every step, compiled also
// for AVX2 and AVX-512 (target attributes, picked by cpu_isa_best()); the
// loops are integer operations and one exact product: the same bits in
// every variant.
struct Bf16Loops {
  void (*plain)(const float* s, bf16* d, int64_t n);
  uint32_t (*scaled)(const float* s, bf16* d, int64_t n, float inv);
};

#define MP_BF16_LOOPS(isa, attributes)                                                                              \
  attributes void to_bf16_##isa(const float* s, bf16* d, int64_t n) { plain_loop(s, d, n); }                       \
  attributes uint32_t to_bf16_scaled_##isa(const float* s, bf16* d, int64_t n, float inv) {                        \
    return scaled_loop(s, d, n, inv);                                                                               \
  }                                                                                                                 \
  constexpr Bf16Loops kBf16Loops_##isa{&to_bf16_##isa, &to_bf16_scaled_##isa};

MP_ISA_VARIANTS(MP_BF16_LOOPS)
#undef MP_BF16_LOOPS

const Bf16Loops& bf16_loops() { return MP_ISA_TABLE(kBf16Loops); }

template <class Src, class Dst, bool kStochastic>
void convert_cpu(const Tensor& src, const Tensor& dst, const ConvertOptions& o) {
  const Src* s = static_cast<const Src*>(src.data());
  Dst* d = static_cast<Dst*>(dst.data());
  const int64_t n = src.numel();
  const math::ConvertParams p = math::make_convert_params(o.seed, o.step, o.index_offset, o.divisor);
  constexpr bool kToBf16 = std::is_same_v<Src, float> && std::is_same_v<Dst, bf16>;
  // The common cases get loops of their own, so that they vectorize.
  if (p.divisor == 1.0 && !kStochastic) {
    if constexpr (kToBf16) {
      bf16_loops().plain(s, d, n);
    } else {
      plain_loop(s, d, n);
    }
    return;
  }
  if (!kStochastic && p.exact_inverse != 0.0f) {
    const float inv = p.exact_inverse;
    if constexpr (std::is_same_v<Dst, float>) {
      // A power-of-two divisor: the fp32 product is the quotient rounded once.
      for (int64_t i = 0; i < n; ++i) d[i] = math::to_f32(s[i]) * inv;
      return;
    } else if (static_cast<const void*>(s) != static_cast<const void*>(d)) {
      // Narrow outputs: exact unless a product is subnormal in fp32.
      uint32_t inexact = 0;
      if constexpr (kToBf16) {
        inexact = bf16_loops().scaled(s, d, n, inv);
      } else {
        inexact = scaled_loop(s, d, n, inv);
      }
      if (inexact == 0) return;
    }
  }
  for (int64_t i = 0; i < n; ++i) math::convert_element<Src, Dst, kStochastic>(s, d, i, p);
}

}  // namespace

void convert(const Tensor& src, const Tensor& dst, const ConvertOptions& options, Stream* stream) {
  MP_ENFORCE(src.defined() && dst.defined(), "convert with an undefined tensor");
  MP_ENFORCE(src.numel() == dst.numel(), "convert from ", src.describe(), " to ", dst.describe(),
             ": element counts differ");
  MP_ENFORCE(src.device() == dst.device(), "convert from ", src.describe(), " to ",
             dst.describe(), ": devices differ");
  MP_ENFORCE(options.divisor != 0.0, "convert with divisor 0");
  const bool stochastic = options.rounding == Rounding::kStochastic;
  if (stochastic && dst.dtype() != DType::kF32 && dst.dtype() != DType::kBF16 &&
      dst.dtype() != DType::kF16) {
    MP_THROW(ConfigError, "stochastic rounding to ", dtype_name(dst.dtype()),
             " is not supported; use bf16, fp16 or nearest_even rounding");
  }
#if !MP_WITH_CUDA
  if (src.device().is_cuda()) MP_THROW(ConfigError, "convert on ", src.device(), ": mp was built without CUDA");
#endif
  auto cpu = [src, dst, options, stochastic] {
    dispatch_dtype(src.dtype(), [&](auto s) {
      dispatch_dtype(dst.dtype(), [&](auto d) {
        using S = decltype(s);
        using D = decltype(d);
        if constexpr (math::kHasStochasticRounding<D>) {
          if (stochastic) return convert_cpu<S, D, true>(src, dst, options);
        }
        convert_cpu<S, D, false>(src, dst, options);
      });
    });
  };
  if (stream == nullptr) {
    MP_ENFORCE(src.device().is_cpu(), "convert of ", src.describe(), " needs a stream on its device");
    return cpu();
  }
  MP_ENFORCE(stream->device() == src.device(), "convert of ", to_string(src.device()), " memory on ",
             to_string(stream->device()), " stream '", stream->name(), "'");
  OpContext{*stream}.run("convert", OpFamily::kElementwise, cpu,
                         MP_CUDA_BODY(convert_cuda(src.data(), src.dtype(), dst.data(), dst.dtype(),
                                                   src.numel(), options, cuda_stream)));
}

}  // namespace mp

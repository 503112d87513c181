// kernels/cpu/convert.cc: convert() for CPU tensors, and the dispatch to the
// CUDA launcher for CUDA tensors.
#include "kernels/convert.h"

#include "kernels/convert_loop.h"
#include "mp/config.h"
#if MP_WITH_CUDA
#include "kernels/cuda/convert_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace mp {
namespace {

template <class Src, class Dst, bool kStochastic>
void convert_cpu(const Tensor& src, const Tensor& dst, const ConvertOptions& o) {
  const Src* s = static_cast<const Src*>(src.data());
  Dst* d = static_cast<Dst*>(dst.data());
  const int64_t n = src.numel();
  for (int64_t i = 0; i < n; ++i) {
    math::convert_element<Src, Dst, kStochastic>(s, d, i, o.seed, o.step, o.index_offset);
  }
}

}  // namespace

void convert(const Tensor& src, const Tensor& dst, const ConvertOptions& options, Stream* stream) {
  MP_ENFORCE(src.defined() && dst.defined(), "convert with an undefined tensor");
  MP_ENFORCE(src.numel() == dst.numel(), "convert from ", src.describe(), " to ", dst.describe(),
             ": element counts differ");
  MP_ENFORCE(src.device() == dst.device(), "convert from ", src.describe(), " to ",
             dst.describe(), ": devices differ");
  const bool stochastic = options.rounding == Rounding::kStochastic;
  if (stochastic && dst.dtype() != DType::kF32 && dst.dtype() != DType::kBF16 &&
      dst.dtype() != DType::kF16) {
    MP_THROW(ConfigError, "stochastic rounding to ", dtype_name(dst.dtype()),
             " is not supported; use bf16, fp16 or nearest_even rounding");
  }
  if (src.device().is_cuda()) {
#if MP_WITH_CUDA
    convert_cuda(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel(), options,
                 cuda_handle(stream));
    return;
#else
    MP_THROW(ConfigError, "convert on ", src.device(), ": mp was built without CUDA");
#endif
  }
  (void)stream;
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
}

}  // namespace mp

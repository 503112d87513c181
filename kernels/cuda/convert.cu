// kernels/cuda/convert.cu: element-wise dtype conversion on CUDA devices.
// One grid-stride kernel per (source, destination, rounding) triple; the
// element math is math::convert_element, shared with the CPU loop.
#include "core/error_cuda.h"
#include "kernels/convert_loop.h"
#include "kernels/cuda/convert_cuda.h"
#include "kernels/cuda/launch.cuh"

namespace mp {
namespace {

// ---- kernels ----------------------------------------------------------------

template <class Src, class Dst, bool kStochastic>
__global__ void convert_elements_kernel(const Src* src, Dst* dst, int64_t n, math::ConvertParams p) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    math::convert_element<Src, Dst, kStochastic>(src, dst, i, p);
  }
}

// ---- launchers --------------------------------------------------------------

template <class Src, class Dst, bool kStochastic>
void launch_convert(const void* src, void* dst, int64_t n, const ConvertOptions& o,
                    cudaStream_t stream) {
  launch_kernel(&convert_elements_kernel<Src, Dst, kStochastic>, cuda_launch::grid_stride("convert_elements_kernel", n),
                stream, static_cast<const Src*>(src), static_cast<Dst*>(dst), n,
                math::make_convert_params(o.seed, o.step, o.index_offset, o.divisor));
}

}  // namespace

void convert_cuda(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                  const ConvertOptions& options, cudaStream_t stream) {
  if (n == 0) return;
  const bool stochastic = options.rounding == Rounding::kStochastic;
  dispatch_dtype(src_dtype, [&](auto s) {
    dispatch_dtype(dst_dtype, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      if constexpr (math::kHasStochasticRounding<D>) {
        if (stochastic) return launch_convert<S, D, true>(src, dst, n, options, stream);
      }
      launch_convert<S, D, false>(src, dst, n, options, stream);
    });
  });
}

}  // namespace mp

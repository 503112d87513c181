#include "kernels/nn/cast.h"

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/convert.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gpt_ops.h"
#if MP_WITH_CUDA
#include "kernels/cuda/convert_cuda.h"
#include "kernels/cuda/gpt_ops_cuda.h"
#endif

namespace mp::nn {

DType bf16_storage(Device device) { return device.is_cpu() ? gemm_bf16_storage() : DType::kBF16; }

Operand round_to_bf16(const OpContext& cx, const float* x, int64_t n, DType storage, void* out) {
  MP_ENFORCE(storage == DType::kBF16 || storage == DType::kF32, "bf16 values stored as ", dtype_name(storage));
  const int threads = cx.threads;
  cx.run("round to bf16", OpFamily::kCast, [=] { gpt_round_to_bf16(x, n, storage, out, threads); },
         MP_CUDA_BODY(gpt_round_to_bf16_cuda(x, n, storage, out, cuda_stream)));
  return Operand{out, storage};
}

void widen(const OpContext& cx, const Tensor& src, const Ranges& ranges, float* dst) {
  MP_ENFORCE(src.defined() && src.shape().size() == 1 && src.device() == cx.device(), "widening ",
             src.defined() ? src.describe() : std::string("an undefined tensor"), " on ", cx.device());
  for (const auto& [begin, end] : ranges) {
    MP_ENFORCE(0 <= begin && begin <= end && end <= src.numel(), "widening [", begin, ", ", end, ") of ",
               src.describe());
  }
  const Tensor out = Tensor::wrap(dst, cx.device(), DType::kF32, {src.numel()});
  const int threads = cx.threads;
  // Element-wise, so the bits do not depend on how the work is split.
  cx.run(
      "widen parameters", OpFamily::kCast,
      [=] {
        constexpr int64_t kChunk = int64_t{1} << 16;
        for (const auto& [begin, end] : ranges) {
          parallel_for(end - begin, threads, kChunk, [&, b = begin](int64_t i0, int64_t i1) {
            convert(src.flat(b + i0, i1 - i0), out.flat(b + i0, i1 - i0));
          });
        }
      },
      MP_CUDA_BODY(for (const auto& [begin, end] : ranges) {
        if (end > begin) {
          convert_cuda(static_cast<const char*>(src.data()) + static_cast<size_t>(begin) * dtype_size(src.dtype()),
                       src.dtype(), static_cast<float*>(out.data()) + begin, DType::kF32, end - begin,
                       ConvertOptions{}, cuda_stream);
        }
      }));
}

}  // namespace mp::nn

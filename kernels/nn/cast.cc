#include "kernels/nn/cast.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/convert.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/matmul.h"
#if MP_WITH_CUDA
#include "kernels/cuda/cast_cuda.h"
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

void convert(const OpContext& cx, Act src, Act dst, int64_t n, const char* name) {
  MP_ENFORCE(n >= 0, "conversion of ", n, " values");
  const int threads = cx.threads;
  cx.run(name, OpFamily::kCast, [=] { gpt_convert(src, dst, n, threads); },
         MP_CUDA_BODY(gpt_convert_cuda(src, dst, n, cuda_stream)));
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
      MP_CUDA_BODY(for (size_t r0 = 0; r0 < ranges.size(); r0 += kMaxWidenRanges) {  // one launch, mostly
        int64_t begins[kMaxWidenRanges], ends[kMaxWidenRanges];
        const int count = static_cast<int>(std::min<size_t>(kMaxWidenRanges, ranges.size() - r0));
        for (int k = 0; k < count; ++k) std::tie(begins[k], ends[k]) = ranges[r0 + static_cast<size_t>(k)];
        widen_ranges_cuda(src.data(), src.dtype(), static_cast<float*>(out.data()), begins, ends, count, cuda_stream);
      }));
}

}  // namespace mp::nn

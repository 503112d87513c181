// kernels/cuda/reduce.cu: fp64 accumulation of rank chunks on CUDA devices,
// the local half of reduce_accumulate kFp32 (Note [Reduce accumulation] in
// comm/communicator.h). One grid-stride kernel per (input, output) dtype
// pair; the element math is math::accumulate_element, shared with the CPU
// loop, so both give the same bits.
#include <algorithm>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/reduce_cuda.h"

namespace mp {
namespace {

template <class In, class Out>
__global__ void accumulate_rank_chunks_kernel(const In* chunks, int n, int64_t stride, int64_t count,
                                              Out* out, math::ElementOp op, double divisor) {
  const int64_t grid_stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += grid_stride) {
    math::accumulate_element(chunks, n, stride, i, out, op, divisor);
  }
}

}  // namespace

void accumulate_rank_chunks_cuda(const void* chunks, DType in, int n, int64_t stride, int64_t count,
                                 void* out, DType out_dtype, math::ElementOp op, double divisor,
                                 cudaStream_t stream) {
  MP_ENFORCE(!is_fp8(in) && !is_fp8(out_dtype), "accumulation of ", dtype_name(in), " into ",
             dtype_name(out_dtype), " is not supported");
  MP_ENFORCE(n >= 1, "accumulation over ", n, " chunks");
  MP_ENFORCE(count <= stride || n == 1, "accumulation of ", count, " elements per chunk with stride ",
             stride);
  if (count <= 0) return;
  dispatch_dtype(in, [&](auto in_tag) {
    dispatch_dtype(out_dtype, [&](auto out_tag) {
      using In = decltype(in_tag);
      using Out = decltype(out_tag);
      // fp8 was rejected above; no kernels are built for it.
      if constexpr (!is_fp8(dtype_of_v<In>) && !is_fp8(dtype_of_v<Out>)) {
        launch_kernel(&accumulate_rank_chunks_kernel<In, Out>,
                      cuda_launch::grid_stride("accumulate_rank_chunks_kernel", count), stream,
                      static_cast<const In*>(chunks), n, stride, count, static_cast<Out*>(out), op, divisor);
      }
    });
  });
}

}  // namespace mp

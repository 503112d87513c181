#include "kernels/nn/gelu.h"

#include "kernels/cpu/gpt_ops.h"
#if MP_WITH_CUDA
#include "kernels/cuda/gpt_ops_cuda.h"
#endif

namespace mp::nn {

void gelu_forward(const OpContext& cx, const float* x, int64_t n, float* out) {
  const int threads = cx.threads;
  cx.run("gelu forward", OpFamily::kGelu, [=] { gpt_gelu_forward(x, n, out, threads); },
         MP_CUDA_BODY(gpt_gelu_forward_cuda(x, n, out, cuda_stream)));
}

void gelu_backward(const OpContext& cx, const float* x, const float* dout, int64_t n, float* dx) {
  const int threads = cx.threads;
  cx.run("gelu backward", OpFamily::kGelu, [=] { gpt_gelu_backward(x, dout, n, dx, threads); },
         MP_CUDA_BODY(gpt_gelu_backward_cuda(x, dout, n, dx, cuda_stream)));
}

}  // namespace mp::nn

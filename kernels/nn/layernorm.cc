#include "kernels/nn/layernorm.h"

#include "core/error.h"
#include "kernels/cpu/gpt_ops.h"
#if MP_WITH_CUDA
#include "kernels/cuda/gpt_ops_cuda.h"
#endif

namespace mp::nn {

void layernorm_forward(const OpContext& cx, const float* x, const float* w, const float* b, int64_t rows,
                       int64_t channels, float* out, float* mean, float* rstd) {
  const int threads = cx.threads;
  cx.run(
      "layernorm forward", OpFamily::kLayerNorm,
      [=] { gpt_layernorm_forward(x, w, b, rows, channels, out, mean, rstd, threads); },
      MP_CUDA_BODY(gpt_layernorm_forward_cuda(x, w, b, rows, channels, out, mean, rstd, cuda_stream)));
}

void residual_layernorm_forward(const OpContext& cx, const float* a, const float* b, const float* w,
                                const float* bias, int64_t rows, int64_t channels, float* sum, float* out,
                                float* mean, float* rstd) {
  const int threads = cx.threads;
  cx.run(
      "residual add + layernorm forward", OpFamily::kLayerNorm,
      [=] {
        gpt_add(a, b, rows * channels, sum, threads);
        gpt_layernorm_forward(sum, w, bias, rows, channels, out, mean, rstd, threads);
      },
      MP_CUDA_BODY(
          gpt_add_layernorm_forward_cuda(a, b, w, bias, rows, channels, sum, out, mean, rstd, cuda_stream)));
}

int64_t layernorm_backward_workspace_bytes(Device device, [[maybe_unused]] int64_t rows,
                                           [[maybe_unused]] int64_t channels) {
  if (device.is_cpu()) return 0;
#if MP_WITH_CUDA
  return gpt_layernorm_backward_cuda_workspace_bytes(rows, channels);
#else
  MP_THROW(ConfigError, "layernorm on ", device, ": mp was built without CUDA");
#endif
}

void layernorm_backward(const OpContext& cx, const float* dout, const float* x, const float* w, const float* mean,
                        const float* rstd, int64_t rows, int64_t channels, float* dx, float* dw, float* db,
                        void* workspace) {
  const int threads = cx.threads;
  cx.run(
      "layernorm backward", OpFamily::kLayerNorm,
      [=] { gpt_layernorm_backward(dout, x, w, mean, rstd, rows, channels, dx, dw, db, threads); },
      MP_CUDA_BODY(
          gpt_layernorm_backward_cuda(dout, x, w, mean, rstd, rows, channels, dx, dw, db, workspace, cuda_stream)));
  (void)workspace;
}

}  // namespace mp::nn

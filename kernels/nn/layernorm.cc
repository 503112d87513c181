#include "kernels/nn/layernorm.h"

#include "core/error.h"
#include "kernels/cpu/layernorm.h"
#if MP_WITH_CUDA
#include "kernels/cuda/layernorm_cuda.h"
#endif

namespace mp::nn {

void layernorm_forward(const OpContext& cx, const float* x, const float* w, const float* b, int64_t rows,
                       int64_t channels, Act out, float* mean, float* rstd, void* workspace) {
  const int threads = cx.threads;
  cx.run(
      "layernorm forward", OpFamily::kLayerNorm,
      [=] {
        gpt_layernorm_forward(x, w, b, rows, channels, out, mean, rstd, static_cast<float*>(workspace), threads);
      },
      MP_CUDA_BODY(gpt_layernorm_forward_cuda(x, w, b, rows, channels, out, mean, rstd, cuda_stream)));
  (void)workspace;
}

int64_t layernorm_workspace_bytes(Device device, [[maybe_unused]] int64_t rows, [[maybe_unused]] int64_t channels) {
  if (device.is_cpu()) return gpt_layernorm_act_scratch_elements(rows, channels) * static_cast<int64_t>(sizeof(float));
#if MP_WITH_CUDA
  return gpt_layernorm_backward_cuda_workspace_bytes(rows, channels);
#else
  MP_THROW(ConfigError, "layernorm on ", device, ": mp was built without CUDA");
#endif
}

void layernorm_backward(const OpContext& cx, Act dout, const float* x, const float* w, const float* mean,
                        const float* rstd, int64_t rows, int64_t channels, float* dx, bool accumulate, Act dx_copy,
                        float* dw, float* db, void* workspace) {
  const int threads = cx.threads;
  cx.run(
      "layernorm backward", OpFamily::kLayerNorm,
      [=] {
        gpt_layernorm_backward(dout, x, w, mean, rstd, rows, channels, dx, accumulate, dx_copy, dw, db,
                               static_cast<float*>(workspace), threads);
      },
      MP_CUDA_BODY(gpt_layernorm_backward_cuda(dout, x, w, mean, rstd, rows, channels, dx, accumulate, dx_copy, dw,
                                               db, workspace, cuda_stream)));
}

}  // namespace mp::nn

#include "kernels/nn/attention.h"

#include "core/error.h"
#include "kernels/cpu/gpt_ops.h"
#if MP_WITH_CUDA
#include "kernels/cuda/flash_attention_cuda.h"
#endif

namespace mp::nn {
namespace {

// Whether the tensor-core kernels take this head size (none without CUDA).
bool tensor_core_head(int64_t head_dim) {
#if MP_WITH_CUDA
  return flash_attention_tc_supported(head_dim);
#else
  (void)head_dim;
  return false;
#endif
}

}  // namespace

bool attention_on_tensor_cores(AttentionKernel kernel, int64_t head_dim, DType matmul_dtype) {
  switch (kernel) {
    case AttentionKernel::kFp32: return false;
    case AttentionKernel::kTensorCores:
      if (!tensor_core_head(head_dim)) {
        MP_THROW(ConfigError, "tensor-core attention takes head sizes 64 and 128; this GPT's is ", head_dim);
      }
      return true;
    case AttentionKernel::kAuto: break;
  }
  return matmul_dtype == DType::kBF16 && tensor_core_head(head_dim);
}

int64_t attention_saved_elements(Device device, const Attention& a) {
  const int64_t rows = a.batch * a.heads * a.seq;
  return device.is_cpu() ? rows * a.seq : rows;
}

int64_t attention_scratch_elements(Device device, const Attention& a) {
  (void)device;  // both: one value per (batch, head, row)
  return a.batch * a.heads * a.seq;
}

void attention_forward(const OpContext& cx, const Attention& a, const float* qkv, float* out, float* saved) {
  const int threads = cx.threads;
  cx.run(
      "attention forward", OpFamily::kAttention,
      [=] { gpt_attention_forward(qkv, a.batch, a.seq, a.channels, a.heads, saved, out, threads); },
      MP_CUDA_BODY(if (a.tensor_cores) {
        flash_attention_tc_forward_cuda(qkv, a.batch, a.seq, a.channels, a.heads, out, saved, cuda_stream);
      } else {
        flash_attention_forward_cuda(qkv, a.batch, a.seq, a.channels, a.heads, out, saved, cuda_stream);
      }));
}

void attention_backward(const OpContext& cx, const Attention& a, const float* qkv, const float* out,
                        const float* saved, const float* dout, float* scratch, float* dqkv) {
  const int threads = cx.threads;
  cx.run(
      "attention backward", OpFamily::kAttention,
      [=] { gpt_attention_backward(qkv, saved, dout, a.batch, a.seq, a.channels, a.heads, scratch, dqkv, threads); },
      MP_CUDA_BODY(if (a.tensor_cores) {
        flash_attention_tc_backward_cuda(qkv, out, saved, dout, a.batch, a.seq, a.channels, a.heads, scratch, dqkv,
                                         cuda_stream);
      } else {
        flash_attention_backward_cuda(qkv, out, saved, dout, a.batch, a.seq, a.channels, a.heads, scratch, dqkv,
                                      cuda_stream);
      }));
  (void)out;
}

}  // namespace mp::nn

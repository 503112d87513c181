#include "kernels/nn/attention.h"

#include "core/error.h"
#include "kernels/cpu/attention.h"
#if MP_WITH_CUDA
#include "kernels/cuda/attention_cuda.h"
#endif

namespace mp::nn {

Attention attention_plan(Device device, AttentionKernel kernel, int64_t batch, int64_t seq, int64_t channels,
                         int64_t heads, bool bf16) {
  Attention a{batch, seq, channels, heads, bf16, false, ""};
  if (device.is_cpu()) return a;
#if MP_WITH_CUDA
  const AttentionCudaShape shape{batch, seq, channels, heads};
  std::string why;
  const bool cudnn = kernel != AttentionKernel::kFp32 && bf16 && attention_cudnn_takes(shape, &why);
  if (kernel == AttentionKernel::kCudnn && !cudnn) {
    MP_THROW(ConfigError, "cuDNN attention was asked for, but ",
             bf16 ? why : std::string("the activations are fp32 (cuDNN's runs on bf16 ones)"));
  }
  a.cudnn = cudnn;
  if (cudnn) {
    a.note = "cuDNN fused attention (bf16 q, k, v, fp32 statistics; " + why + ")";
  } else if (bf16 && kernel == AttentionKernel::kAuto) {
    a.note = "the fp32 flash kernels on fp32 copies of the bf16 q, k, v: " + why;
  } else {
    a.note = "the fp32 flash kernels";
  }
  return a;
#else
  (void)kernel;
  MP_THROW(ConfigError, "attention on ", device, ": mp was built without CUDA");
#endif
}

int64_t attention_saved_elements(Device device, const Attention& a) {
  const int64_t rows = a.batch * a.heads * a.seq;
  return device.is_cpu() ? rows * a.seq : rows;
}

int64_t attention_scratch_bytes(Device device, const Attention& a) {
  if (device.is_cpu()) {
    return gpt_attention_act_scratch_elements(a.batch, a.seq, a.channels, a.heads) *
           static_cast<int64_t>(sizeof(float));
  }
#if MP_WITH_CUDA
  return attention_cuda_scratch_bytes(AttentionCudaShape{a.batch, a.seq, a.channels, a.heads}, a.cudnn, a.bf16);
#else
  MP_THROW(ConfigError, "attention on ", device, ": mp was built without CUDA");
#endif
}

void attention_forward(const OpContext& cx, const Attention& a, Act qkv, Act out, float* saved, void* scratch) {
  const int threads = cx.threads;
  cx.run(
      "attention forward", OpFamily::kAttention,
      [=] {
        gpt_attention_forward(qkv, a.batch, a.seq, a.channels, a.heads, saved, out, static_cast<float*>(scratch),
                              threads);
      },
      MP_CUDA_BODY(attention_forward_cuda(AttentionCudaShape{a.batch, a.seq, a.channels, a.heads}, a.cudnn, qkv,
                                          out, saved, scratch, cuda_stream)));
}

void attention_backward(const OpContext& cx, const Attention& a, Act qkv, Act out, const float* saved, Act dout,
                        void* scratch, Act dqkv) {
  const int threads = cx.threads;
  cx.run(
      "attention backward", OpFamily::kAttention,
      [=] {
        gpt_attention_backward(qkv, saved, dout, a.batch, a.seq, a.channels, a.heads, dqkv,
                               static_cast<float*>(scratch), threads);
      },
      MP_CUDA_BODY(attention_backward_cuda(AttentionCudaShape{a.batch, a.seq, a.channels, a.heads}, a.cudnn, qkv,
                                           out, saved, dout, scratch, dqkv, cuda_stream)));
  (void)out;
}

}  // namespace mp::nn

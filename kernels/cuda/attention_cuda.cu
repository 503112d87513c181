// kernels/cuda/attention_cuda.cu: which attention runs (kernels/cuda/
// attention_cuda.h): cuDNN's, or the fp32 flash kernels with their glue for
// bf16 activations.
#include "core/error.h"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/flash_attention_cuda.h"
#include "mp/config.h"
#if MP_WITH_CUDNN
#include "kernels/cuda/attention_cudnn.h"
#endif

namespace mp {
namespace {

bool plain(const Act& a) { return a.dtype == DType::kF32 && !a.bf16; }

#if MP_WITH_CUDNN
SdpaShape sdpa(const AttentionCudaShape& s) { return SdpaShape{s.batch, s.heads, s.seq, s.channels / s.heads}; }

const bf16* bf16_of(const Act& a, const char* what) {
  MP_ENFORCE(a.dtype == DType::kBF16, "cuDNN attention's ", what, " stored as ", dtype_name(a.dtype), ": need bf16");
  return static_cast<const bf16*>(a.data);
}
#endif

[[maybe_unused]] void no_cudnn() { MP_THROW(ConfigError, "cuDNN attention in a build without cuDNN"); }

// The fallback's scratch, in floats: fp32 copies of qkv, out, dout and dqkv
// where they hold bf16 values, then the flash backward's own.
struct FlashScratch {
  float *qkv, *out, *dout, *dqkv, *own;
};
FlashScratch flash_scratch(const AttentionCudaShape& s, void* base) {
  const int64_t rc = s.batch * s.seq * s.channels;
  auto* p = static_cast<float*>(base);
  return FlashScratch{p, p + 3 * rc, p + 4 * rc, p + 5 * rc, p + 8 * rc};
}

// a's fp32 values: a itself, or widened into `copy`.
const float* as_f32(const Act& a, int64_t n, float* copy, cudaStream_t stream) {
  if (plain(a)) return a.f32();
  gpt_convert_cuda(a, f32_act(copy), n, stream);
  return copy;
}

}  // namespace

std::string attention_cudnn_library() {
#if MP_WITH_CUDNN
  return attention_cudnn_describe();
#else
  return "mp was built without cuDNN";
#endif
}

bool attention_cudnn_takes(const AttentionCudaShape& shape, std::string* why) {
#if MP_WITH_CUDNN
  if (!attention_cudnn_supported(sdpa(shape), why)) return false;
  *why = attention_cudnn_describe();
  return true;
#else
  (void)shape;
  *why = "mp was built without cuDNN";
  return false;
#endif
}

int64_t attention_cuda_scratch_bytes(const AttentionCudaShape& s, bool cudnn, bool bf16) {
  if (cudnn) {
#if MP_WITH_CUDNN
    return attention_cudnn_workspace_bytes(sdpa(s));
#else
    no_cudnn();
#endif
  }
  const int64_t rc = s.batch * s.seq * s.channels;
  const int64_t own = flash_attention_backward_scratch_elements(s.batch, s.seq, s.heads);
  return ((bf16 ? 8 * rc : 0) + own) * static_cast<int64_t>(sizeof(float));
}

void attention_forward_cuda(const AttentionCudaShape& s, bool cudnn, Act qkv, Act out, float* saved, void* scratch,
                            cudaStream_t stream) {
  if (cudnn) {
#if MP_WITH_CUDNN
    attention_cudnn_forward(sdpa(s), bf16_of(qkv, "input"), const_cast<bf16*>(bf16_of(out, "output")), saved, scratch,
                            attention_cudnn_workspace_bytes(sdpa(s)), stream);
    return;
#else
    no_cudnn();
#endif
  }
  const int64_t rc = s.batch * s.seq * s.channels;
  const FlashScratch f = flash_scratch(s, scratch);
  const float* q = as_f32(qkv, 3 * rc, f.qkv, stream);
  float* y = plain(out) ? out.f32() : f.out;
  flash_attention_forward_cuda(q, s.batch, s.seq, s.channels, s.heads, y, saved, stream);
  if (!plain(out)) gpt_convert_cuda(f32_act(y), out, rc, stream);
}

void attention_backward_cuda(const AttentionCudaShape& s, bool cudnn, Act qkv, Act out, const float* saved,
                             Act dout, void* scratch, Act dqkv, cudaStream_t stream) {
  if (cudnn) {
#if MP_WITH_CUDNN
    attention_cudnn_backward(sdpa(s), bf16_of(qkv, "input"), bf16_of(out, "output"), bf16_of(dout, "output gradient"),
                             saved, const_cast<bf16*>(bf16_of(dqkv, "input gradient")), scratch,
                             attention_cudnn_workspace_bytes(sdpa(s)), stream);
    return;
#else
    no_cudnn();
#endif
  }
  const int64_t rc = s.batch * s.seq * s.channels;
  const FlashScratch f = flash_scratch(s, scratch);
  const bool any_bf16 = !plain(qkv) || !plain(out) || !plain(dout) || !plain(dqkv);
  float* own = any_bf16 ? f.own : static_cast<float*>(scratch);
  const float* q = as_f32(qkv, 3 * rc, f.qkv, stream);
  const float* y = as_f32(out, rc, f.out, stream);
  const float* g = as_f32(dout, rc, f.dout, stream);
  float* dq = plain(dqkv) ? dqkv.f32() : f.dqkv;
  flash_attention_backward_cuda(q, y, saved, g, s.batch, s.seq, s.channels, s.heads, own, dq, stream);
  if (!plain(dqkv)) gpt_convert_cuda(f32_act(dq), dqkv, 3 * rc, stream);
}

}  // namespace mp

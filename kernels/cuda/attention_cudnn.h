// kernels/cuda/attention_cudnn.h: causal multi-head self-attention through
// cuDNN's fused scaled-dot-product attention (SDPA), forward and backward,
// on the GPT's bf16 qkv layout: the bf16 recipes' GPU attention. Only in
// builds with MP_WITH_CUDNN (cmake/MpDependencies.cmake).
//
// Note [cuDNN attention]
// - Math: per batch b and head h, out = softmax(q k^T / sqrt(hs)) v over
//   keys t2 <= t, as gpt_attention_forward (kernels/cpu/attention.h). bf16
//   qkv, out, dout and dqkv; fp32 scores, softmax and accumulation inside
//   cuDNN; fp32 Stats (the rows' log-sum-exp) from the forward for the
//   backward. Layout: Note [cuDNN attention layout] (kernels/sdpa_layout.h):
//   q, k and v are read where they lie in qkv, dq, dk and dv written where
//   they lie in dqkv; nothing is permuted or copied.
// - cuDNN is opened at run time (dlopen: libcudnn.so.<major> by its soname,
//   then the file CMake found), never linked, so a process that runs no
//   cuDNN attention never loads it; the cuDNN frontend (header-only, at the
//   version scripts/cudnn_frontend pins) builds the graphs and reaches cuDNN
//   through that handle (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING). Where the
//   library cannot be loaded, the calls below throw CudaError naming it and
//   the loader's reason, and attention_cudnn_supported says so.
// - Graphs: one forward and one backward graph per (device, shape), built
//   together on the first call that names the shape (validated, lowered,
//   heuristics mode A then the fallback list, the first plan that builds)
//   and kept for the life of the process, refused shapes included.
// - Refusal: where cuDNN takes no plan for a shape (the frontend's
//   validation, no engine, no plan that builds), forward, backward and
//   attention_cudnn_workspace_bytes throw CudnnUnsupportedError, whose
//   message names the shape, the step that failed and cuDNN's reason;
//   attention_cudnn_supported answers without executing anything, so the
//   caller can pick another kernel first.
// - Threads: every function may be called from any thread. One mutex
//   serialises building graphs and enqueueing (each device has one cuDNN
//   handle, bound to the call's stream before each execution).
// - Workspace: the caller's, device memory of at least
//   attention_cudnn_workspace_bytes(shape) bytes (the larger of the two
//   graphs' needs; may be 0, then workspace may be null). Calls that share
//   a workspace must be ordered (one stream, or streams the caller orders).
// - Determinism: the backward asks for cuDNN's deterministic algorithm, so
//   repeated calls give the same bits; they differ from the CPU's and from
//   the flash kernels' within bf16 rounding (tests/gpu/
//   test_gpu_attention_cudnn.cc states the tolerance).
// - Pointers are device memory on the calling thread's current device,
//   16-byte aligned (cuDNN's attention loads 16 bytes at a time); outputs
//   overlap no input. Asynchronous on `stream`; shapes and pointers are
//   checked on the host (EnforceError).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/sdpa_layout.h"

namespace mp {

// cuDNN has no plan for this shape on this device: the message names the
// shape and cuDNN's reason. The caller may run another attention kernel.
class CudnnUnsupportedError : public CudaError {
 public:
  using CudaError::CudaError;
};

// Whether cuDNN runs `shape` on the current device: builds and caches both
// graphs (or the refusal) without executing. On false, *reason (when not
// null) says why: cuDNN's refusal, or that cuDNN cannot be loaded. Throws
// only for a CUDA error (no usable device) or a bad shape (EnforceError).
bool attention_cudnn_supported(const SdpaShape& shape, std::string* reason = nullptr);

// Bytes of workspace that forward and backward of `shape` need on the
// current device; CudnnUnsupportedError when cuDNN refuses the shape.
int64_t attention_cudnn_workspace_bytes(const SdpaShape& shape);

// out [B T, C] and stats [B, H, T] (fp32) := causal attention of qkv
// [B T, 3 C]; both overwritten.
void attention_cudnn_forward(const SdpaShape& shape, const bf16* qkv, bf16* out, float* stats, void* workspace,
                             int64_t workspace_bytes, cudaStream_t stream);

// dqkv [B T, 3 C] := the gradient of the forward at qkv, given its out and
// stats and dout [B T, C]; overwritten.
void attention_cudnn_backward(const SdpaShape& shape, const bf16* qkv, const bf16* out, const bf16* dout,
                              const float* stats, bf16* dqkv, void* workspace, int64_t workspace_bytes,
                              cudaStream_t stream);

// "cuDNN 91900 at /path/libcudnn.so.9.19.0, frontend 1.32.0" (the file the
// loader resolved), or "not loaded: " and why: for logs and benchmarks.
// Loads cuDNN on the first call; never throws.
std::string attention_cudnn_describe();

}  // namespace mp

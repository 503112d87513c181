// kernels/cuda/gemm_cublaslt.h: C = op(A) op(B) (+ bias) (+ C) on a CUDA
// device through cuBLASLt: the device twin of gemm_cpu (kernels/cpu/gemm.h),
// taking the same GemmProblem (kernels/gemm_problem.h), so a caller switches device by switching the
// call. A and B are fp32 or bf16, C and bias are fp32; every product is
// accumulated in fp32 (CUBLAS_COMPUTE_32F). All pointers are device memory.
//
// Note [cuBLASLt GEMM]
// - Row-major problems go to column-major cuBLASLt as C^T = op(B)^T op(A)^T:
//   a row-major matrix [r, c] with leading dimension ld is the column-major
//   [c, r] with the same ld, so no operand is copied or transposed.
// - bf16 x bf16 multiplies natively; an fp32 x bf16 pair (cuBLASLt has no
//   mixed-input matmul) widens the bf16 operand to packed fp32 on the stream
//   (stream-ordered scratch, cudaMallocAsync), which is exact, and runs the
//   fp32 GEMM: the same products of the same values.
// - fp32 x fp32 is true fp32 unless GemmCudaOptions::allow_tf32.
// - Alignment. An algorithm may assume the alignment of every pointer it is
//   given. A plan is chosen for the alignment class (the largest power of
//   two up to 256 dividing the address) of each of A, B, C = D, bias and
//   aux: the heuristic gets A's to D's as
//   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES (256 for an operand packed
//   into fresh memory) and reads bias's and aux's from the descriptor,
//   whose bias and aux pointers (and aux's ld) are set before it is queried.
//   The five classes are in the plan cache key, so a plan found for aligned
//   pointers never runs on less aligned ones; every call sets its own bias
//   and aux pointers on the descriptor again before cublasLtMatmul.
// - Forms. A plan takes the first of these forms that the heuristic has an
//   algorithm for (fewer where they coincide: no bias, no GELU):
//   1. fused: the bias (CUBLASLT_EPILOGUE_BIAS: added after the product,
//      before C is written; D = AB (+ C) + bias) and the forward GELU
//      (CUBLASLT_EPILOGUE_GELU_AUX[_BIAS]) in cuBLASLt's epilogue. Only with
//      no bias or a 16-byte-aligned one: cuBLASLt's GELU follows its bias.
//      Never for kDGelu (GemmEpilogue: cuBLASLt's DGELU is not fp32-accurate);
//   2. the product with form 1's bias epilogue (none for a bias less than
//      16-byte aligned: a kernel adds it after the matmul, one more fp32
//      rounding), then the GELU by a kernel with math::gelu /
//      math::gelu_grad (kernels/gpt_math.h). Its descriptor, layouts and
//      preferences are those of the same problem without the GELU, so the
//      heuristic, given the same inputs, picks the same algorithm;
//   3. the plain product, then the bias and the GELU by kernels;
//   4. as 3 with both operands packed to fp32 (the same values): for a
//      layout or pointer alignment no algorithm takes.
//   When cublasLtMatmul refuses a plan's algorithm (CUBLAS_STATUS_NOT_SUPPORTED,
//   _ARCH_MISMATCH or _INVALID_VALUE), the plan is replaced by the next form
//   the heuristic has an algorithm for and the call runs again in it; later
//   calls go straight to it. When no form is left, CudaError names the shape.
//   GemmCudaOptions::gelu_by_kernel starts at form 2, for tests. k = 0 runs
//   no matmul: C = bias (or zeros) (+ C), then the GELU by the kernel.
// - cuBLASLt is not linked (docs/testing.md "Building by hand"): the first GemmCuda opens
//   libcublasLt with dlopen; a process that runs no GPU GEMM never loads it.
// - A GemmCuda owns one cuBLASLt handle, a workspace (kGemmCudaWorkspaceBytes)
//   and a cache of plans, one per key: the problem shape (m, n, k, leading
//   dimensions, dtypes, transposes, accumulate, TF32, epilogue, aux ld,
//   gelu_by_kernel) and the five alignment classes. A plan holds its form,
//   its descriptors and the algorithm the heuristic picked. A key runs the
//   same algorithm every time, and cuBLAS documents bitwise identical results
//   run to run for one toolkit, GPU architecture and SM count; so repeated
//   calls give the same bits (tests/gpu/test_gpu_gpt_ops.cc checks it). Bits
//   may differ from gemm_cpu's and between GPU models.
// - Every call on a GemmCuda uses its one workspace, so its calls must be
//   ordered: one stream, or streams the caller orders. gemm_cuda() keeps one
//   GemmCuda per (thread, device, stream), so its streams never share one.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/gemm_problem.h"

namespace mp {

inline constexpr int64_t kGemmCudaWorkspaceBytes = int64_t{32} << 20;

// A GELU fused after the product (GemmCudaOptions::epilogue): the GPT's MLP.
enum class GemmEpilogue : uint8_t {
  kNone = 0,
  // C := gelu(op(A) op(B) + bias) and aux := op(A) op(B) + bias, the
  // pre-activation the backward needs (CUBLASLT_EPILOGUE_GELU_AUX[_BIAS]).
  kGelu = 1,
  // C := (op(A) op(B)) * gelu'(aux), aux the forward's pre-activation: the
  // gradient through the GELU. Always the product, then a kernel: cuBLASLt's
  // CUBLASLT_EPILOGUE_DGELU was measured about 5e-5 off float64 in relative
  // terms on an H200 (cuBLASLt 13.1; ~900 fp32 ulps, a low-precision tanh),
  // where the kernel's math::gelu_grad is within a few ulps.
  kDGelu = 2,
};

struct GemmCudaOptions {
  // fp32 x fp32 with TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32): inputs
  // rounded to 10 mantissa bits, fp32 accumulation. Off: exact fp32 products.
  bool allow_tf32 = false;
  // With an epilogue: aux is an fp32 [m, n] matrix, row stride aux_ld (a
  // multiple of 8, >= n, 16-byte aligned), written by kGelu and read by
  // kDGelu; not with accumulate; kDGelu takes no bias. Where cuBLASLt has no
  // fused algorithm, or refuses it, the product is followed by a kernel
  // computing the same with math::gelu / math::gelu_grad (kernels/gpt_math.h;
  // Note [cuBLASLt GEMM], forms). cuBLASLt's own GELU is the tanh form too,
  // but its bits may differ from math::gelu's in the last places.
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  float* aux = nullptr;
  int64_t aux_ld = 0;
  // For tests: with an epilogue, run the GELU by the kernel even where
  // cuBLASLt has a fused algorithm (form 2 of Note [cuBLASLt GEMM]), so the
  // two can be compared; the product and its bias are then computed as for
  // the same problem without the epilogue.
  bool gelu_by_kernel = false;
};

// One cuBLASLt handle, workspace and plan cache on one device. Not thread-safe:
// one per thread (Note [cuBLASLt GEMM]).
class GemmCuda {
 public:
  // Allocates the workspace on `device`; throws CudaError when cuBLASLt cannot
  // be loaded or the device cannot allocate.
  explicit GemmCuda(int device, int64_t workspace_bytes = kGemmCudaWorkspaceBytes);
  ~GemmCuda();
  GemmCuda(const GemmCuda&) = delete;
  GemmCuda& operator=(const GemmCuda&) = delete;

  // The GemmProblem contract of kernels/gemm_problem.h, on `stream`, asynchronous.
  // Throws EnforceError for a bad shape, leading dimension, dtype or pointer,
  // and CudaError (naming the shape) when cuBLASLt fails. The calling thread's
  // current device must be device().
  void run(const GemmProblem& problem, cudaStream_t stream, const GemmCudaOptions& options = {});

  int device() const;
  // Plans cached so far (one per key: shape and alignment classes).
  int64_t cached_plans() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// GemmCuda::run on the calling thread's GemmCuda for (current device, stream),
// created on first use and kept until the thread exits.
void gemm_cuda(const GemmProblem& problem, cudaStream_t stream, const GemmCudaOptions& options = {});

// "cuBLASLt 130000 (libcublasLt.so.13)": for logs and benchmarks. Loads
// cuBLASLt; throws CudaError if it cannot.
std::string gemm_cuda_describe();

}  // namespace mp

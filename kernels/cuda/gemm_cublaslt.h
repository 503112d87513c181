// kernels/cuda/gemm_cublaslt.h: one GemmProblem (kernels/gemm_problem.h) on
// a CUDA device through cuBLASLt: the device twin of gemm_cpu
// (kernels/cpu/gemm.h), taking the same problem with the same epilogue
// (Note [GEMM epilogue]), so a caller switches device by switching the
// call. All pointers are device memory; every product is accumulated in
// fp32 (CUBLAS_COMPUTE_32F).
//
// Note [cuBLASLt GEMM]
// - Row-major problems go to column-major cuBLASLt as C^T = op(B)^T op(A)^T:
//   a row-major matrix [r, c] with leading dimension ld is the column-major
//   [c, r] with the same ld, so no operand is copied or transposed. Our B is
//   cuBLASLt's A: the bias gradient of our op(B) is its BGRADA.
// - Forms. A plan takes the first of these the heuristic has an algorithm
//   for:
//   1. fused: everything in cuBLASLt. D is C in C's dtype (bf16 output:
//      the bf16 recipes' activations); the bias (fp32,
//      CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) with CUBLASLT_EPILOGUE_BIAS,
//      the GELU with its pre-activation as GELU_AUX[_BIAS] (aux in C's
//      dtype), the bias gradient as BGRADA; the
//      addend as cuBLASLt's C (beta 1, C and D different matrices), and
//      accumulate as C = D with beta 1. Not where C holds bf16 values in
//      fp32 storage (cuBLASLt cannot round to them);
//   2. product, then kernels: the plain product into fp32 scratch (the
//      GemmCuda's own, grown in stream order and kept), then one kernel for
//      the whole epilogue (bias, addend, accumulate, GELU or its gradient,
//      rounding) and two for the bias gradient's column sums
//      (kernels/cuda/gemm_kernels_cuda.h);
//   3. as 2 with both operands packed to fp32 (the same values): for a
//      layout or pointer alignment no algorithm takes (bf16 x bf16 too:
//      right, but at fp32 speed; the plan's report names the form, and the
//      models' shapes never need it).
//   An fp32 x bf16 pair (cuBLASLt has no mixed-input matmul) packs its bf16
//   side to fp32 in every form (exact): the fp32 GEMM of the same values.
//   When cublasLtMatmul refuses a plan's algorithm (CUBLAS_STATUS_NOT_SUPPORTED,
//   _ARCH_MISMATCH or _INVALID_VALUE), the plan is replaced by the next form
//   and the call runs again in it; later calls go straight to it. When no
//   form is left, CudaError names the shape.
// - Algorithms. For a new plan the heuristic is asked for up to
//   kGemmCandidates algorithms of its form, and one is kept as Note [GEMM
//   algorithm choice] (kernels/gemm_choice.h) says: the one recorded in the
//   process's choice book (a resumed run's), else the first in
//   deterministic mode, else each timed on the real problem with CUDA
//   events (waiting at most 60 s a run) and the first kept unless another
//   is clearly faster. A problem that accumulates into C is not timed. A
//   plan's form, algorithm and measured TFLOP/s are reported once
//   (gemm_cuda_new_plans: the run log's and mp_bench's GEMM table).
// - Epilogues cuBLASLt does not run: DGELU (cuBLASLt's is about 5e-5
//   relative off float64, measured on an H200) and any with a bias, aux or
//   bias gradient pointer less than 16-byte aligned; those take form 2.
// - Alignment. An algorithm may assume the alignment of every pointer it is
//   given. A plan is chosen for the alignment class (the largest power of
//   two up to 256 dividing the address) of each of A, B, C, D, bias, aux
//   and the bias gradient; the classes are in the plan cache key, so a
//   plan found for aligned pointers never runs on less aligned ones; every
//   call sets its own pointers on the descriptor before cublasLtMatmul.
// - Determinism: a key runs the same algorithm every time, and cuBLAS
//   documents bitwise identical results run to run for one toolkit, GPU
//   architecture and SM count; the kernels have fixed orders. Bits differ
//   from gemm_cpu's and between GPU models.
// - cuBLASLt is not linked (docs/testing.md "Building by hand"): the first GemmCuda opens
//   libcublasLt with dlopen; a process that runs no GPU GEMM never loads it.
// - A GemmCuda owns one cuBLASLt handle, a workspace (kGemmCudaWorkspaceBytes)
//   and a cache of plans. Every call on a GemmCuda uses its one workspace,
//   so its calls must be ordered: one stream, or streams the caller orders.
//   gemm_cuda() keeps one GemmCuda per (thread, device, stream).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/gemm_problem.h"

namespace mp {

inline constexpr int64_t kGemmCudaWorkspaceBytes = int64_t{32} << 20;
inline constexpr int kGemmCandidates = 8;

struct GemmCudaOptions {
  // fp32 x fp32 with TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32): inputs
  // rounded to 10 mantissa bits, fp32 accumulation. Off: exact fp32 products.
  bool allow_tf32 = false;
  // For tests: start at form 2 (the product, then the kernels), so the two
  // can be compared.
  bool epilogue_by_kernel = false;
  // Keep the heuristic's first candidate, untimed (Note [GEMM algorithm
  // choice]); off: time them, and keep the first unless another is clearly
  // faster.
  bool deterministic = false;
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

  // The GemmProblem contract of kernels/gemm_problem.h, on `stream`, asynchronous
  // (but for a new plan's timing, which waits for the stream). Throws
  // EnforceError for a bad shape, leading dimension, dtype or pointer, and
  // CudaError (naming the shape) when cuBLASLt fails. The calling thread's
  // current device must be device().
  void run(const GemmProblem& problem, cudaStream_t stream, const GemmCudaOptions& options = {});

  int device() const;
  // Plans cached so far (one per key: shape and alignment classes).
  int64_t cached_plans() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The forms a plan for `problem` may take, best first (Note [cuBLASLt
// GEMM]), by name: host logic, no device needed.
std::vector<std::string> gemm_cuda_forms(const GemmProblem& problem, const GemmCudaOptions& options = {});

// GemmCuda::run on the calling thread's GemmCuda for (current device, stream),
// created on first use and kept until the thread exits.
void gemm_cuda(const GemmProblem& problem, cudaStream_t stream, const GemmCudaOptions& options = {});

// A plan as made: for the run log and mp_bench (Note [cuBLASLt GEMM]).
struct GemmPlanReport {
  int device = 0;
  std::string problem;  // "4096 x 2304 x 768, bf16 x bf16 -> bf16, bias"
  std::string form;     // "fused (bias)", "product, then kernels", "packed to fp32, then kernels"
  int algorithm = -1;   // cuBLASLt's algorithm id
  int candidates = 0;   // the heuristic's, timed
  double tflops = 0;    // of the kept one; 0: not timed
};
// The plans made since the last call, in every thread, each reported once.
std::vector<GemmPlanReport> gemm_cuda_new_plans();

// "cuBLASLt 130000 (libcublasLt.so.13)": for logs and benchmarks. Loads
// cuBLASLt; throws CudaError if it cannot.
std::string gemm_cuda_describe();

}  // namespace mp

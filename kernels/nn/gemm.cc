#include "kernels/nn/gemm.h"

#include "kernels/cpu/gemm.h"
#if MP_WITH_CUDA
#include "kernels/cuda/gemm_cublaslt.h"
#endif

namespace mp::nn {
namespace {

GemmInput stored(Operand o, int64_t ld, bool transposed = false) { return GemmInput{o.data, o.dtype, ld, transposed}; }

}  // namespace

void gemm(const OpContext& cx, const GemmSettings& settings, const GemmProblem& problem, const char* name) {
  const int threads = cx.threads;
  cx.run(
      name, OpFamily::kGemm,
      [=] {
        GemmOptions o;
        o.threads = threads;
        gemm_cpu(problem, o);
      },
      MP_CUDA_BODY(
          gemm_cuda(problem, cuda_stream,
                    GemmCudaOptions{.allow_tf32 = settings.allow_tf32, .deterministic = settings.deterministic})));
  (void)settings;
}

GemmProblem linear_forward(Operand x, Operand w, const float* bias, int64_t rows, int64_t in, int64_t out, Act y,
                           const float* addend, Act gelu_pre) {
  // [rows, out] = x [rows, in] w [in, out] + bias
  GemmProblem p = gemm_problem(rows, out, in, stored(x, in), stored(w, out), y.data, y.dtype, y.bf16, bias);
  p.addend = addend;
  if (gelu_pre.data != nullptr) {
    p.epilogue = GemmEpilogue::kGelu;
    p.aux = gelu_pre.data;
    p.aux_ld = out;
  }
  return p;
}

GemmProblem linear_backward_input(Operand dy, Operand w, int64_t rows, int64_t in, int64_t out, Act dx,
                                  Act gelu_pre) {
  // [rows, in] = dy [rows, out] w^T (w stored [in, out])
  GemmProblem p =
      gemm_problem(rows, in, out, stored(dy, out), stored(w, out, /*transposed=*/true), dx.data, dx.dtype, dx.bf16);
  if (gelu_pre.data != nullptr) {
    p.epilogue = GemmEpilogue::kDGelu;
    p.aux = gelu_pre.data;
    p.aux_ld = in;
  }
  return p;
}

GemmProblem linear_backward_weight(Operand x, Operand dy, int64_t rows, int64_t in, int64_t out, float* dw,
                                   float* db) {
  // [in, out] = x^T (x stored [rows, in]) dy [rows, out]
  GemmProblem p = gemm_problem(in, out, rows, stored(x, in, /*transposed=*/true), stored(dy, out), dw);
  p.bias_grad = db;
  return p;
}

}  // namespace mp::nn

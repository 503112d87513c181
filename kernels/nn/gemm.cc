#include "kernels/nn/gemm.h"

#include "core/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gpt_ops.h"
#if MP_WITH_CUDA
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/cuda/gpt_ops_cuda.h"
#endif

namespace mp::nn {
namespace {

GptGemmInput cpu_input(Operand o) { return GptGemmInput{o.data, o.dtype}; }
GemmInput stored(Operand o, int64_t ld, bool transposed = false) { return GemmInput{o.data, o.dtype, ld, transposed}; }

// Where cuBLASLt can apply the GELU in the epilogue: its aux matrix's row
// stride must be a multiple of 8 (kernels/cuda/gemm_cublaslt.h).
[[maybe_unused]] bool gelu_epilogue(int64_t ld) { return ld % 8 == 0; }

#if MP_WITH_CUDA
GemmCudaOptions cuda_options(const GemmSettings& s, GemmEpilogue epilogue = GemmEpilogue::kNone,
                             const float* aux = nullptr, int64_t aux_ld = 0) {
  GemmCudaOptions o;
  o.allow_tf32 = s.allow_tf32;
  if (aux != nullptr) {
    o.epilogue = epilogue;
    o.aux = const_cast<float*>(aux);  // kDGelu only reads it
    o.aux_ld = aux_ld;
  }
  return o;
}
#endif

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
      MP_CUDA_BODY(gemm_cuda(problem, cuda_stream, cuda_options(settings))));
  (void)settings;
}

void linear_forward(const OpContext& cx, const GemmSettings& settings, Operand x, Operand w, const float* bias,
                    int64_t rows, int64_t in, int64_t out, float* y, float* gelu_pre) {
  // [rows, out] = x [rows, in] w [in, out] + bias
  const GemmProblem p = gemm_problem(rows, out, in, stored(x, in), stored(w, out), gelu_pre != nullptr ? gelu_pre : y,
                                     bias);
  const int threads = cx.threads;
  cx.run(
      gelu_pre != nullptr ? "linear + gelu forward" : "linear forward", OpFamily::kGemm,
      [=] {
        gpt_matmul_forward(cpu_input(x), cpu_input(w), bias, rows, in, out, p.c, threads);
        if (gelu_pre != nullptr) gpt_gelu_forward(gelu_pre, rows * out, y, threads);
      },
      MP_CUDA_BODY(if (gelu_pre != nullptr && gelu_epilogue(out)) {
        GemmProblem fused = p;
        fused.c = y;
        gemm_cuda(fused, cuda_stream, cuda_options(settings, GemmEpilogue::kGelu, gelu_pre, out));
      } else {
        gemm_cuda(p, cuda_stream, cuda_options(settings));
        if (gelu_pre != nullptr) gpt_gelu_forward_cuda(gelu_pre, rows * out, y, cuda_stream);
      }));
  (void)settings;
}

int64_t linear_backward_workspace_bytes(Device device, [[maybe_unused]] int64_t rows, [[maybe_unused]] int64_t out) {
  if (device.is_cpu()) return 0;
#if MP_WITH_CUDA
  return gpt_bias_backward_cuda_workspace_bytes(rows, out);
#else
  MP_THROW(ConfigError, "linear layer on ", device, ": mp was built without CUDA");
#endif
}

void linear_backward(const OpContext& cx, const GemmSettings& settings, Operand x, Operand w, Operand dy,
                     const float* dy_f32, int64_t rows, int64_t in, int64_t out, float* dx, float* dw, float* db,
                     void* workspace, const float* gelu_pre) {
  const GemmProblem pdx = gemm_problem(rows, in, out, stored(dy, out), stored(w, out, /*transposed=*/true), dx);
  const GemmProblem pdw = gemm_problem(in, out, rows, stored(x, in, /*transposed=*/true), stored(dy, out), dw);
  const int threads = cx.threads;
  cx.run(
      gelu_pre != nullptr ? "linear + gelu backward" : "linear backward", OpFamily::kGemm,
      [=] {
        gpt_matmul_backward(cpu_input(x), cpu_input(w), cpu_input(dy), rows, in, out, dx, dw, threads);
        gpt_bias_backward(dy_f32, rows, out, db, threads);
        if (gelu_pre != nullptr && dx != nullptr) gpt_gelu_backward(gelu_pre, dx, rows * in, dx, threads);
      },
      MP_CUDA_BODY(if (dx != nullptr) {
        if (gelu_pre != nullptr && gelu_epilogue(in)) {
          gemm_cuda(pdx, cuda_stream, cuda_options(settings, GemmEpilogue::kDGelu, gelu_pre, in));
        } else {
          gemm_cuda(pdx, cuda_stream, cuda_options(settings));
          if (gelu_pre != nullptr) gpt_gelu_backward_cuda(gelu_pre, dx, rows * in, dx, cuda_stream);
        }
      } gemm_cuda(pdw, cuda_stream, cuda_options(settings));
                   gpt_bias_backward_cuda(dy_f32, rows, out, db, workspace, cuda_stream)));
  (void)settings;
  (void)workspace;
  (void)pdx;
  (void)pdw;
}

}  // namespace mp::nn

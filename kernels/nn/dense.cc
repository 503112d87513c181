#include "kernels/nn/dense.h"

#include "core/error.h"
#include "kernels/cpu/mlp_ops.h"
#include "kernels/gemm_problem.h"
#if MP_WITH_CUDA
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/cuda/gpt_ops_cuda.h"
#include "kernels/cuda/mlp_ops_cuda.h"
#endif

namespace mp::nn {
namespace {

GemmInput f32(const float* p, int64_t ld, bool transposed = false) {
  return GemmInput{p, DType::kF32, ld, transposed};
}

}  // namespace

void dense_forward(const OpContext& cx, const Dense& d, const float* x, const float* w, const float* b, float* y) {
  const int threads = cx.threads;
  // y [batch, out] = x [batch, in] w^T (w stored [out, in]) + b
  const GemmProblem p = gemm_problem(d.batch, d.out, d.in, f32(x, d.in), f32(w, d.in, true), y, b);
  cx.run(
      "dense forward", OpFamily::kGemm,
      [=] { mlp_layer_forward(x, w, b, d.batch, d.in, d.out, d.hidden, y, threads); },
      MP_CUDA_BODY(gemm_cuda(p, cuda_stream); if (d.hidden) mlp_tanh_forward_cuda(y, d.batch * d.out, cuda_stream)));
  (void)p;
}

int64_t dense_backward_workspace_bytes(Device device, [[maybe_unused]] int64_t batch, [[maybe_unused]] int64_t out) {
  if (device.is_cpu()) return 0;
#if MP_WITH_CUDA
  return gpt_bias_backward_cuda_workspace_bytes(batch, out);
#else
  MP_THROW(ConfigError, "dense layer on ", device, ": mp was built without CUDA");
#endif
}

void dense_backward(const OpContext& cx, const Dense& d, const float* x, const float* w, const float* y, float* dy,
                    float* dw, float* db, float* dx, void* workspace) {
  const int threads = cx.threads;
  // dw [out, in] = dz^T (dz stored [batch, out]) x [batch, in]; dx [batch, in] = dz w [out, in].
  const GemmProblem pdw = gemm_problem(d.out, d.in, d.batch, f32(dy, d.out, true), f32(x, d.in), dw);
  const GemmProblem pdx = gemm_problem(d.batch, d.in, d.out, f32(dy, d.out), f32(w, d.in), dx);
  cx.run(
      "dense backward", OpFamily::kGemm,
      [=] { mlp_layer_backward(x, w, y, dy, d.batch, d.in, d.out, d.hidden, dw, db, dx, threads); },
      MP_CUDA_BODY(if (d.hidden) mlp_tanh_backward_cuda(y, dy, d.batch * d.out, cuda_stream);
                   gemm_cuda(pdw, cuda_stream);
                   gpt_bias_backward_cuda(dy, d.batch, d.out, db, workspace, cuda_stream);
                   if (dx != nullptr) gemm_cuda(pdx, cuda_stream)));
  (void)pdw;
  (void)pdx;
  (void)workspace;
}

void dense_loss(const OpContext& cx, const float* logits, const int32_t* labels, int64_t batch, int64_t classes,
                float* dlogits, float* row_loss, double* mean) {
  cx.run(
      "softmax cross-entropy", OpFamily::kSoftmaxXent,
      [=] { *mean = mlp_softmax_xent(logits, labels, batch, classes, dlogits); },
      MP_CUDA_BODY(gpt_softmax_xent_rows_cuda(logits, labels, batch, classes, classes, batch, row_loss, dlogits,
                                              cuda_stream);
                   gpt_mean_loss_cuda(row_loss, batch, mean, cuda_stream)));
  (void)row_loss;
}

}  // namespace mp::nn

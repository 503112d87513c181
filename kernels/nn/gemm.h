// kernels/nn/gemm.h: a model's matrix products as ops on a stream (Note [Op
// dispatch] in kernels/dispatch.h): one GemmProblem (kernels/gemm_problem.h)
// with its epilogue (Note [GEMM epilogue]) runs on gemm_cpu (oneDNN and
// kernels/cpu/gemm_epilogue.h) or gemm_cuda (cuBLASLt, its epilogue where
// it has an algorithm for it), one op each. The GPT's Conv1D layers (y = x w
// + bias, w stored [in, out]) describe their three products with the
// functions below: the forward with its bias, residual add or GELU; the
// input gradient, through the GELU; the weight gradient with the bias
// gradient.
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"
#include "kernels/gemm_problem.h"
#include "kernels/nn/cast.h"

namespace mp::nn {

// GEMM settings of a model (both devices read what applies to them).
struct GemmSettings {
  bool allow_tf32 = false;  // CUDA: fp32 x fp32 on TF32 tensor cores (the tf32 recipe)
  // CUDA: GEMM algorithms chosen untimed (Note [GEMM algorithm choice])
  bool deterministic = false;
};

// The GemmProblem contract, on cx's device: one op.
void gemm(const OpContext& cx, const GemmSettings& settings, const GemmProblem& problem, const char* name);

// y [rows, out] := x [rows, in] w [in, out] + bias (fp32, may be null) (+
// addend [rows, out], fp32, for an fp32 y: the residual stream). With
// gelu_pre (data not null, stored as y is): gelu_pre := x w + bias and y :=
// gelu(gelu_pre), the MLP's first layer.
GemmProblem linear_forward(Operand x, Operand w, const float* bias, int64_t rows, int64_t in, int64_t out, Act y,
                           const float* addend = nullptr, Act gelu_pre = {});

// dx [rows, in] := dy [rows, out] w^T. With gelu_pre (the forward's, stored
// as dx is): dx := (dy w^T) * gelu'(gelu_pre), the gradient of the layer
// input's pre-activation.
GemmProblem linear_backward_input(Operand dy, Operand w, int64_t rows, int64_t in, int64_t out, Act dx,
                                  Act gelu_pre = {});

// dw [in, out] := x^T dy (fp32) and db (may be null) := the column sums of
// dy [rows, out] over the rows (its values as stored), in fp32.
GemmProblem linear_backward_weight(Operand x, Operand dy, int64_t rows, int64_t in, int64_t out, float* dw,
                                   float* db);

}  // namespace mp::nn

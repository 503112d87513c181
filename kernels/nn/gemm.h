// kernels/nn/gemm.h: a model's matrix products as ops on a stream (Note [Op
// dispatch] in kernels/dispatch.h): one GemmProblem (kernels/gemm_problem.h)
// runs on gemm_cpu (oneDNN) or gemm_cuda (cuBLASLt), and the Conv1D layers
// of the GPT (y = x w + bias, w stored [in, out]) add their bias and GELU
// around it: in the GEMM's epilogue on a GPU where cuBLASLt takes it, as
// the CPU's separate loops otherwise, always the same math (the bias added
// in fp32, math::gelu).
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"
#include "kernels/gemm_problem.h"
#include "kernels/nn/cast.h"

namespace mp::nn {

// GEMM settings of a model (both devices read what applies to them).
struct GemmSettings {
  bool allow_tf32 = false;  // CUDA: fp32 x fp32 on TF32 tensor cores (the tf32 recipe)
};

// C = op(A) op(B) (+ bias) (+ C): the GemmProblem contract, on cx's device.
void gemm(const OpContext& cx, const GemmSettings& settings, const GemmProblem& problem, const char* name);

// y[rows, out] = x[rows, in] w[in, out] + bias[out] (bias fp32, may be
// null). With gelu_pre: gelu_pre := x w + bias and y := gelu(gelu_pre),
// the MLP's first layer.
void linear_forward(const OpContext& cx, const GemmSettings& settings, Operand x, Operand w, const float* bias,
                    int64_t rows, int64_t in, int64_t out, float* y, float* gelu_pre = nullptr);

// Scratch of linear_backward's bias gradient on `device` (0 on the CPU).
int64_t linear_backward_workspace_bytes(Device device, int64_t rows, int64_t out);

// dx = dy w^T (skipped when dx is null; with gelu_pre, the input was
// gelu(gelu_pre) and dx is taken on through it: dx *= gelu'(gelu_pre)),
// dw = x^T dy, and db = the column sums of dy_f32 (the fp32 gradient that
// `dy` may be the bf16 rounding of), summed over rows in order.
void linear_backward(const OpContext& cx, const GemmSettings& settings, Operand x, Operand w, Operand dy,
                     const float* dy_f32, int64_t rows, int64_t in, int64_t out, float* dx, float* dw, float* db,
                     void* workspace, const float* gelu_pre = nullptr);

}  // namespace mp::nn

// kernels/cpu/gemm_epilogue.h (private to kernels/cpu): what gemm_cpu does
// after oneDNN's product (Note [GEMM epilogue] in kernels/gemm_problem.h):
// the addend, the GELU or its gradient, the output's rounding to bf16, and
// the bias gradient. Each function covers one tile of C or one range of
// columns, so gemm_cpu can run them on its tiles' threads.
#pragma once

#include <cstdint>

#include "kernels/gemm_problem.h"

namespace mp {

// Whether `p` needs the epilogue below after its product, or oneDNN alone
// writes C (fp32 C, with the bias and accumulate as oneDNN's bias and sum
// post-op, an addend as the summand of that sum: gemm_cpu copies it into C
// first).
bool gemm_needs_epilogue(const GemmProblem& p);

// Rows [i0, i0 + rows) and columns [j0, j0 + cols) of C from `product`
// ([rows, cols], leading dimension product_ld): the product plus the bias
// (oneDNN added it), through Note [GEMM epilogue] into C and aux. product
// is the caller's scratch: overwritten.
void gemm_epilogue_tile(const GemmProblem& p, float* product, int64_t product_ld, int64_t i0, int64_t rows,
                        int64_t j0, int64_t cols);

// bias_grad[j] for j in [j0, j1) := the sum over k of op(B)[k, j], k in
// order, in fp32.
void gemm_bias_grad_of_b(const GemmProblem& p, int64_t j0, int64_t j1);

}  // namespace mp

// kernels/cuda/gemm_kernels_cuda.h (private to kernels/cuda): the kernels
// of the GEMM's forms where cuBLASLt does not do everything (Note [cuBLASLt
// GEMM] in gemm_cublaslt.h): an operand packed to fp32, the epilogue of
// Note [GEMM epilogue] after a plain fp32 product, and the bias gradient's
// column sums. The per-element math is the CPU's (kernels/gpt_math.h,
// kernels/convert_math.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/gemm_problem.h"

namespace mp {

// dst [rows, cols] (packed fp32, ld = cols) := src (fp32 or bf16, ld).
void gemm_pack_fp32_cuda(const void* src, DType dtype, int64_t ld, int64_t rows, int64_t cols, float* dst,
                         cudaStream_t stream);

// C (and aux) of `p` from `product` ([m, n] fp32, ld n; null: the k = 0
// product, zeros): bias, addend, accumulate, the GELU or its gradient and
// the rounding of Note [GEMM epilogue].
void gemm_epilogue_cuda(const GemmProblem& p, const float* product, cudaStream_t stream);

// p.bias_grad[j] := sum over k of op(B)[k, j], in two passes
// (kernels/cuda/column_sums.cuh: the same bits for the same inputs).
// `workspace`: gemm_bias_grad_cuda_workspace_bytes(p).
int64_t gemm_bias_grad_cuda_workspace_bytes(const GemmProblem& p);
void gemm_bias_grad_cuda(const GemmProblem& p, void* workspace, cudaStream_t stream);

}  // namespace mp

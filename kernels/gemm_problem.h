// kernels/gemm_problem.h: one GEMM, described once for every device:
// C = op(A) op(B) (+ bias) (+ C), fp32 or bf16 inputs, fp32 output and
// accumulation. gemm_cpu (kernels/cpu/gemm.h) and gemm_cuda
// (kernels/cuda/gemm_cublaslt.h) take the same GemmProblem, and the model
// ops (kernels/nn/gemm.h) pick between them by the stream's device.
//
// Layout: every matrix is row-major with a leading dimension (the elements
// between the starts of consecutive stored rows). A transposed operand is
// described by strides, never copied: op(A) = A^T reads A stored [k, m].
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mp {

// A read-only GEMM input: `data` holds `dtype` elements (kF32 or kBF16),
// row-major with leading dimension `ld`. The operand the product uses is the
// stored matrix, or its transpose when `transposed`.
struct GemmInput {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t ld = 0;
  bool transposed = false;
};

// C[m, n] = op(A)[m, k] op(B)[k, n] (+ bias[n] on every row) (+ C when
// accumulate). A is stored [m, k] (ld >= k), or [k, m] (ld >= m) when
// transposed; B is stored [k, n] (ld >= n), or [n, k] (ld >= k) when
// transposed; C is stored [m, n] with ldc >= n. C must not overlap A, B or
// bias. k = 0 gives C = bias (or zeros), added to C when accumulate.
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  GemmInput a;
  GemmInput b;
  const float* bias = nullptr;  // null: no bias
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
};

// C[m, n] = op(a) op(b) (+ bias), C dense (ldc = n), not accumulated.
inline GemmProblem gemm_problem(int64_t m, int64_t n, int64_t k, GemmInput a, GemmInput b, float* c,
                                const float* bias = nullptr) {
  GemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a = a;
  p.b = b;
  p.bias = bias;
  p.c = c;
  p.ldc = n;
  return p;
}

}  // namespace mp

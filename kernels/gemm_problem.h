// kernels/gemm_problem.h: one GEMM and what follows it, described once for
// every device: C = epilogue(op(A) op(B) (+ bias) (+ addend) (+ C)), fp32
// or bf16 inputs, accumulation in fp32, the output stored in fp32 or bf16.
// gemm_cpu (kernels/cpu/gemm.h) and gemm_cuda (kernels/cuda/gemm_cublaslt.h)
// take the same GemmProblem, and the model ops (kernels/nn/gemm.h) pick
// between them by the stream's device.
//
// Layout: every matrix is row-major with a leading dimension (the elements
// between the starts of consecutive stored rows). A transposed operand is
// described by strides, never copied: op(A) = A^T reads A stored [k, m].
//
// Note [GEMM epilogue]
// Each output element is, in this order, in fp32:
//   v = sum_k op(A)[i, k] op(B)[k, j]        (the product; order: the library's)
//   v = v + bias[j]                           (bias)
//   v = v + addend[i, j]                      (addend: a residual stream)
//   v = v + C[i, j]                           (accumulate)
//   kGelu:  aux[i, j] = v, stored as C is;  v = gelu(v)
//   kDGelu: v = v * gelu'(aux[i, j])         (aux as the forward stored it)
//   C[i, j] = v, rounded to bf16 (nearest even) where C holds bf16 values
// with gelu and gelu' the tanh forms of kernels/gpt_math.h; and, beside C,
//   bias_grad[j] = sum_k op(B)[k, j]           (fp32, k in order on the CPU)
// the bias gradient of a weight-gradient product dW = x^T dy, from dy as
// stored (bf16 values in the bf16 recipes). These are what the GPT's layers
// need in one call (kernels/nn/gemm.h): the bias, the GELU with its saved
// pre-activation, the residual add, the gradient through the GELU and the
// bias gradients. On a GPU cuBLASLt runs them in its epilogue where it has
// an algorithm for that (Note [cuBLASLt GEMM]); its rounding of the same
// formulas may differ in the last bits.
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

// The GELU of Note [GEMM epilogue].
enum class GemmEpilogue : uint8_t {
  kNone = 0,
  kGelu = 1,   // aux := the pre-activation, C := its GELU (the GPT's MLP forward)
  kDGelu = 2,  // C := the product times gelu'(aux) (its backward)
};

// C[m, n] = epilogue(op(A)[m, k] op(B)[k, n] ...) (Note [GEMM epilogue]).
// A is stored [m, k] (ld >= k), or [k, m] (ld >= m) when transposed; B is
// stored [k, n] (ld >= n), or [n, k] (ld >= k) when transposed; C is stored
// [m, n] with ldc >= n, as c_dtype (kF32 or kBF16); with c_bf16 an fp32 C
// holds bf16 values (each rounded to bf16, stored exactly as fp32: how a
// CPU without bf16 GEMMs keeps bf16 activations, kernels/nn/cast.h). C
// must not overlap A, B, bias, addend, aux or bias_grad. k = 0 gives a zero
// product. The optional parts:
// - bias [n], fp32;
// - addend [m, n], fp32 with leading dimension ldc, for an fp32 C only;
// - accumulate: for an fp32 C without an epilogue only;
// - epilogue: aux [m, n] with leading dimension aux_ld >= n, stored as C
//   is; kDGelu takes no bias and no addend;
// - bias_grad [n], fp32, written (never accumulated).
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  GemmInput a;
  GemmInput b;
  const float* bias = nullptr;  // null: no bias
  void* c = nullptr;
  DType c_dtype = DType::kF32;
  bool c_bf16 = false;
  int64_t ldc = 0;
  bool accumulate = false;
  const float* addend = nullptr;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  void* aux = nullptr;
  int64_t aux_ld = 0;
  float* bias_grad = nullptr;  // null: none

  // Whether C holds bf16 values (stored as bf16, or as fp32 with c_bf16).
  bool bf16_output() const { return c_dtype == DType::kBF16 || c_bf16; }
  // C as fp32 (c_dtype kF32).
  float* c_f32() const { return static_cast<float*>(c); }
};

// C[m, n] = op(a) op(b) (+ bias), C fp32 and dense (ldc = n), not accumulated.
inline GemmProblem gemm_problem(int64_t m, int64_t n, int64_t k, GemmInput a, GemmInput b, float* c,
                                const float* bias = nullptr) {
  return GemmProblem{.m = m, .n = n, .k = k, .a = a, .b = b, .bias = bias, .c = c, .ldc = n};
}

// The same with C stored as `c_dtype`, holding bf16 values when c_bf16.
inline GemmProblem gemm_problem(int64_t m, int64_t n, int64_t k, GemmInput a, GemmInput b, void* c, DType c_dtype,
                                bool c_bf16, const float* bias = nullptr) {
  return GemmProblem{.m = m, .n = n, .k = k, .a = a, .b = b, .bias = bias, .c = c, .c_dtype = c_dtype,
                     .c_bf16 = c_bf16 || c_dtype == DType::kBF16, .ldc = n};
}

}  // namespace mp

#include "kernels/newton_schulz.h"

#include <cmath>

#include "core/error.h"

namespace mp {

void check_newton_schulz(int64_t rows, int64_t cols, const NewtonSchulzOptions& o) {
  MP_ENFORCE(rows > 0 && cols > 0, "newton_schulz: a [", rows, ", ", cols, "] matrix");
  MP_ENFORCE(o.dtype == DType::kF32 || o.dtype == DType::kBF16, "newton_schulz in ", dtype_name(o.dtype),
             ": need fp32 or bf16");
  MP_ENFORCE(o.steps >= 0, "newton_schulz: ", o.steps, " steps");
  MP_ENFORCE(std::isfinite(o.a) && std::isfinite(o.b) && std::isfinite(o.c) && std::isfinite(o.eps),
             "newton_schulz: coefficients (", o.a, ", ", o.b, ", ", o.c, ") and eps ", o.eps, " must be finite");
}

NsProducts ns_products(int64_t m, int64_t n, DType s, void* x, void* a, void* b, float* p) {
  return NsProducts{
      gemm_problem(m, m, n, GemmInput{x, s, n, false}, GemmInput{x, s, n, true}, a, s, s == DType::kBF16),
      gemm_problem(m, m, m, GemmInput{a, s, m, false}, GemmInput{a, s, m, false}, p),
      gemm_problem(m, n, m, GemmInput{b, s, m, false}, GemmInput{x, s, n, false}, p)};
}

}  // namespace mp

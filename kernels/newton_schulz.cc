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

GemmProblem ns_gram_problem(int64_t m, int64_t n, DType s) {
  return gemm_problem(m, m, n, GemmInput{nullptr, s, n, false}, GemmInput{nullptr, s, n, true}, nullptr, s,
                      s == DType::kBF16);
}

GemmProblem ns_square_problem(int64_t m, DType s) {
  return gemm_problem(m, m, m, GemmInput{nullptr, s, m, false}, GemmInput{nullptr, s, m, false}, nullptr);
}

GemmProblem ns_apply_problem(int64_t m, int64_t n, DType s) {
  return gemm_problem(m, n, m, GemmInput{nullptr, s, m, false}, GemmInput{nullptr, s, n, false}, nullptr);
}

NsProducts ns_products(int64_t m, int64_t n, DType s, void* x, void* a, void* b, float* p) {
  NsProducts q{ns_gram_problem(m, n, s), ns_square_problem(m, s), ns_apply_problem(m, n, s)};
  q.gram.a.data = x;
  q.gram.b.data = x;
  q.gram.c = a;
  q.square.a.data = a;
  q.square.b.data = a;
  q.square.c = p;
  q.apply.a.data = b;
  q.apply.b.data = x;
  q.apply.c = p;
  return q;
}

}  // namespace mp

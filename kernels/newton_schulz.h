// kernels/newton_schulz.h: what the CPU and CUDA Newton-Schulz iterations of
// Muon share (Note [Newton-Schulz iteration] in kernels/cpu/newton_schulz.h):
// the options, their check and the three products of an iteration as
// GemmProblems (kernels/gemm_problem.h), data pointers left to the caller.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/gemm_problem.h"

namespace mp {

struct NewtonSchulzOptions {
  // X <- a X + (b A + c A^2) X: torch's defaults, the quintic of
  // https://kellerjordan.github.io/posts/muon/.
  double a = 3.4445, b = -4.7750, c = 2.0315;
  int steps = 5;
  double eps = 1e-7;               // the norm's floor
  DType dtype = DType::kBF16;      // the iteration dtype: kBF16 (torch's) or kF32
  int threads = 0;                 // CPU: 0 is default_cpu_threads()
};

// EnforceError for a [rows, cols] matrix that is empty, an iteration dtype
// other than fp32 or bf16, negative steps or a coefficient that is not finite.
void check_newton_schulz(int64_t rows, int64_t cols, const NewtonSchulzOptions& options);

// For X [m, n] (m <= n) in the iteration dtype s, the three products on X,
// A and B (stored in s) and P (fp32); without the pointers, their shapes.
struct NsProducts {
  GemmProblem gram;    // A = X X^T [m, m], stored in s (rounded to it)
  GemmProblem square;  // P = A A [m, m], fp32
  GemmProblem apply;   // P = B X [m, n], fp32
};
NsProducts ns_products(int64_t m, int64_t n, DType s, void* x = nullptr, void* a = nullptr, void* b = nullptr,
                       float* p = nullptr);

}  // namespace mp

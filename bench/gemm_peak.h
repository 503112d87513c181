// bench/gemm_peak.h: this machine's GEMM peak, the reference of the `gemm`
// and `gpt` suites, measured in the same run as what is judged against it.
//
// Note [GEMM peak reference]
// A single square GEMM underestimates some CPUs: on a 2-vCPU Xeon without
// avx512_bf16 the fp32 GPT-2 step ran at 1.42x a 2048^3 GEMM's GFLOP/s.
// So the reference is the best of several GEMMs of the dtype through
// gemm_cpu: large squares (1024^3, 2048^3) and every GEMM of a GPT-2 124M
// step at 256 rows (the `gpt` suite's B x T): each layer's forward, input
// gradient and weight gradient, and the tied head's logits. The model's
// FLOP/s cannot beat the best of its own GEMMs on the same threads by more
// than noise, so a ratio against it is a fraction of what this CPU does.
// Beside it stands the theoretical FMA peak (bench/cpu_peak.h), from the
// CPU's instructions and clock, which nothing measured should reach.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mp::bench {

// Best GFLOP/s of C[n, n] = A B (A and B in `dtype`: fp32, or bf16 with
// fp32 accumulation and output) through gemm_cpu on `threads` threads:
// random operands, one untimed call, then the best of `iters`.
// With `sync` other than MPI_COMM_NULL every call starts after a barrier on
// it (collective), so all ranks of a job compete for the cores as training
// does.
double gemm_cpu_square_gflops(int64_t n, int threads, int iters, MPI_Comm sync = MPI_COMM_NULL,
                              DType dtype = DType::kF32);

// One GEMM of the peak's set: C[m, n] = op(A)[m, k] op(B)[k, n].
struct PeakShape {
  std::string name;  // "2048^3", "c_fc forward", ...
  int64_t m = 0, n = 0, k = 0;
  bool a_transposed = false, b_transposed = false;
};

// The set of Note [GEMM peak reference], for a GPT with `rows` = B x T.
std::vector<PeakShape> gemm_peak_shapes(int64_t rows = 256);

struct GemmPeak {
  double gflops = 0;        // the best
  std::string best;         // the shape that gave it
  std::vector<std::pair<std::string, double>> all;  // every shape's best GFLOP/s
};

// Note [GEMM peak reference]: the best GFLOP/s over `shapes` in `dtype` on
// `threads` threads, each timed as gemm_cpu_square_gflops times its square.
// With `sync`: collective, every rank runs each shape at once and a shape's
// GFLOP/s is the sum over the ranks (the job's), the best of those sums.
GemmPeak gemm_cpu_peak(int threads, int iters, MPI_Comm sync = MPI_COMM_NULL, DType dtype = DType::kF32,
                       const std::vector<PeakShape>& shapes = gemm_peak_shapes());

}  // namespace mp::bench

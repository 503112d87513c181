// bench/gemm_peak.h: this machine's GEMM peak, the reference of the `gemm`
// and `gpt` suites, measured once here for both.
#pragma once

#include <mpi.h>

#include <cstdint>

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

}  // namespace mp::bench

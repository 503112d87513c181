#include "bench/gemm_peak.h"

#include <random>
#include <vector>

#include "bench/timing.h"
#include "kernels/cpu/gemm.h"

namespace mp::bench {

double gemm_cpu_square_gflops(int64_t n, int threads, int iters, MPI_Comm sync) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(n * n)), b(a.size()), c(a.size());
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  GemmProblem p;
  p.m = p.n = p.k = n;
  p.a = GemmInput{a.data(), DType::kF32, n, false};
  p.b = GemmInput{b.data(), DType::kF32, n, false};
  p.c = c.data();
  p.ldc = n;
  GemmOptions o;
  o.threads = threads;
  const LocalTiming t = time_local(1, iters, [&] { gemm_cpu(p, o); }, sync);
  return 2.0 * static_cast<double>(n * n * n) / t.min_s / 1e9;
}

}  // namespace mp::bench

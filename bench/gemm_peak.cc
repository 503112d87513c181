#include "bench/gemm_peak.h"

#include <random>
#include <vector>

#include "bench/timing.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/gemm.h"

namespace mp::bench {

double gemm_cpu_square_gflops(int64_t n, int threads, int iters, MPI_Comm sync, DType dtype) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(n * n)), b(a.size()), c(a.size());
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  std::vector<bf16> a16, b16;
  if (dtype == DType::kBF16) {
    for (float x : a) a16.push_back(math::from_f32<bf16>(x));
    for (float x : b) b16.push_back(math::from_f32<bf16>(x));
  }
  GemmProblem p;
  p.m = p.n = p.k = n;
  p.a = dtype == DType::kBF16 ? GemmInput{a16.data(), DType::kBF16, n, false} : GemmInput{a.data(), DType::kF32, n, false};
  p.b = dtype == DType::kBF16 ? GemmInput{b16.data(), DType::kBF16, n, false} : GemmInput{b.data(), DType::kF32, n, false};
  p.c = c.data();
  p.ldc = n;
  GemmOptions o;
  o.threads = threads;
  const LocalTiming t = time_local(1, iters, [&] { gemm_cpu(p, o); }, sync);
  return 2.0 * static_cast<double>(n * n * n) / t.min_s / 1e9;
}

}  // namespace mp::bench

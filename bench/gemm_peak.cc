#include "bench/gemm_peak.h"

#include <random>
#include <vector>

#include "bench/timing.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/gemm.h"

namespace mp::bench {
namespace {

// GFLOP/s of one shape: random operands stored as the shape reads them.
double shape_gflops(const PeakShape& s, int threads, int iters, MPI_Comm sync, DType dtype) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // Stored [m, k] or, transposed, [k, m]; B stored [k, n] or [n, k].
  const int64_t a_cols = s.a_transposed ? s.m : s.k, b_cols = s.b_transposed ? s.k : s.n;
  std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n)),
      c(static_cast<size_t>(s.m * s.n));
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  std::vector<bf16> a16, b16;
  if (dtype == DType::kBF16) {
    for (float x : a) a16.push_back(math::from_f32<bf16>(x));
    for (float x : b) b16.push_back(math::from_f32<bf16>(x));
  }
  const bool half = dtype == DType::kBF16;
  GemmProblem p;
  p.m = s.m;
  p.n = s.n;
  p.k = s.k;
  p.a = GemmInput{half ? static_cast<const void*>(a16.data()) : a.data(), dtype, a_cols, s.a_transposed};
  p.b = GemmInput{half ? static_cast<const void*>(b16.data()) : b.data(), dtype, b_cols, s.b_transposed};
  p.c = c.data();
  p.ldc = s.n;
  std::vector<float> scratch(static_cast<size_t>(gemm_scratch_elements(p)));
  GemmOptions o;
  o.threads = threads;
  o.scratch = scratch.data();
  o.scratch_elements = static_cast<int64_t>(scratch.size());
  const LocalTiming t = time_local(1, iters, [&] { gemm_cpu(p, o); }, sync);
  return 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) / t.min_s / 1e9;
}

}  // namespace

double gemm_cpu_square_gflops(int64_t n, int threads, int iters, MPI_Comm sync, DType dtype) {
  return shape_gflops(PeakShape{"square", n, n, n}, threads, iters, sync, dtype);
}

std::vector<PeakShape> gemm_peak_shapes(int64_t rows) {
  std::vector<PeakShape> shapes = {{"1024^3", 1024, 1024, 1024}, {"2048^3", 2048, 2048, 2048}};
  // GPT-2 124M's layers (in, out) as kernels/nn/gemm.h runs them: forward
  // x[rows, in] w[in, out]; input gradient dy[rows, out] w^T; weight
  // gradient x^T dy.
  struct Layer {
    const char* name;
    int64_t in, out;
  };
  for (const Layer& l : {Layer{"c_attn", 768, 2304}, Layer{"attn.c_proj", 768, 768}, Layer{"c_fc", 768, 3072},
                         Layer{"mlp.c_proj", 3072, 768}}) {
    const std::string n = l.name;
    shapes.push_back({n + " forward", rows, l.out, l.in, false, false});
    shapes.push_back({n + " input gradient", rows, l.in, l.out, false, true});
    shapes.push_back({n + " weight gradient", l.in, l.out, rows, true, false});
  }
  // The tied head: logits[rows, 50304] = x wte^T (wte stored [vocab, C]).
  shapes.push_back({"logits", rows, 50304, 768, false, true});
  return shapes;
}

GemmPeak gemm_cpu_peak(int threads, int iters, MPI_Comm sync, DType dtype, const std::vector<PeakShape>& shapes) {
  GemmPeak peak;
  for (const PeakShape& s : shapes) {
    double g = shape_gflops(s, threads, iters, sync, dtype);
    if (sync != MPI_COMM_NULL) MPI_Allreduce(MPI_IN_PLACE, &g, 1, MPI_DOUBLE, MPI_SUM, sync);
    peak.all.emplace_back(s.name, g);
    if (g > peak.gflops) {
      peak.gflops = g;
      peak.best = s.name;
    }
  }
  return peak;
}

}  // namespace mp::bench

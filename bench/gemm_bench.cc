// bench/gemm_bench.cc: suite "gemm": gemm_cpu (kernels/cpu/gemm.h) on the
// GEMM shapes of GPT-2 124M at M = B T rows (default 256: B = 4, T = 64),
// against this machine's GEMM peak measured in the same run.
//
// Peak: the best GFLOP/s over the timed calls of a 2048^3 fp32 GEMM, taken
// as the larger of gemm_cpu's and oneDNN's own (its matmul primitive on
// its OpenMP threads, as an application calling oneDNN directly would run
// it), on the same number of threads.
// Cases <layout>_<K>x<N>_<dtype>_<T>t for the weights K x N of c_attn
// (768x2304), attn c_proj (768x768), c_fc (768x3072), mlp c_proj
// (3072x768) and the tied head (768x50304), each as the model runs it:
//   fwd  y[M, N] = x[M, K] w[K, N]         (head: logits = x wte^T, wte [N, K])
//   dx   dx[M, K] = dy[M, N] w^T           (head: dlogits wte)
//   dw   dw[K, N] = x^T dy                 (head: dwte[N, K] = dlogits^T x)
// in fp32 and with bf16 inputs (widened to fp32 where oneDNN has no bf16
// matmul on this CPU: "native_bf16" says which). value = GFLOP/s (2 M N K
// flops over the median time), ref = the peak, ratio = fraction of peak.
// Each fwd fp32 case also times a naive triple loop (i, k, j order, the
// inner loop vectorized by the compiler, rows split over the same threads)
// on the same shape once, as "naive_gflops".
//
// --sizes M sets the rows; threads: 1 and default_cpu_threads() (launch with
// `launch/mprun -np 1 --bind-to none`, so that is every CPU).
#include <omp.h>

#include <algorithm>
#include <dnnl.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/gemm_peak.h"
#include "bench/suites.h"
#include "bench/timing.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/gemm.h"

namespace mp::bench {
namespace {


std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = math::from_f32<bf16>(v[i]);
  return out;
}

// oneDNN's own matmul, C[n, n] = A B, on `threads` OpenMP threads: best GFLOP/s.
double onednn_square_gflops(int64_t n, int threads, int iters) {
  const std::vector<float> a = random_floats(n * n, 1), b = random_floats(n * n, 2);
  std::vector<float> c(static_cast<size_t>(n * n));
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::desc d({n, n}, dnnl::memory::data_type::f32, dnnl::memory::dims{n, 1});
  const dnnl::matmul matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(d, d, d), engine));
  dnnl::memory am(d, engine, const_cast<float*>(a.data())), bm(d, engine, const_cast<float*>(b.data())),
      cm(d, engine, c.data());
  const LocalTiming t = time_local(1, iters, [&] {
    matmul.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
  });
  omp_set_num_threads(saved);
  return 2.0 * static_cast<double>(n * n * n) / t.min_s / 1e9;
}

// C[m, n] = A[m, k] B[k, n], i-k-j: each row of C gets a row of B times a[i, l].
double naive_gflops(int64_t m, int64_t n, int64_t k, int threads) {
  const std::vector<float> a = random_floats(m * k, 3), b = random_floats(k * n, 4);
  std::vector<float> c(static_cast<size_t>(m * n));
  const LocalTiming t = time_local(0, 1, [&] {
    parallel_for(m, threads, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        float* __restrict ci = c.data() + i * n;
        std::fill(ci, ci + n, 0.0f);
        for (int64_t l = 0; l < k; ++l) {
          const float ail = a[static_cast<size_t>(i * k + l)];
          const float* __restrict bl = b.data() + l * n;
          for (int64_t j = 0; j < n; ++j) ci[j] += ail * bl[j];
        }
      }
    });
  });
  return 2.0 * static_cast<double>(m * n * k) / t.median_s / 1e9;
}

struct Weight {
  const char* name;
  int64_t k, n;
  bool head;  // the tied head: wte is stored [n, k]
};

// The problem of one layout: inputs sized for it, in `dtype`.
struct Operands {
  std::vector<float> a32, b32;
  std::vector<bf16> a16, b16;
  std::vector<float> c, scratch;
  GemmProblem p;
};

void setup(Operands& o, const Weight& w, int64_t rows, const std::string& layout, DType dtype) {
  // Stored shapes and the problem, per layout (see the header comment).
  int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
  bool ta = false, tb = false;
  GemmProblem& p = o.p;
  if (layout == "fwd") {
    p.m = rows, p.n = w.n, p.k = w.k;
    a_rows = rows, a_cols = w.k;
    tb = w.head;
    b_rows = w.head ? w.n : w.k, b_cols = w.head ? w.k : w.n;
  } else if (layout == "dx") {
    p.m = rows, p.n = w.k, p.k = w.n;
    a_rows = rows, a_cols = w.n;
    tb = !w.head;
    b_rows = w.head ? w.n : w.k, b_cols = w.head ? w.k : w.n;
  } else {  // dw: [k, n] = x^T dy, or the head's [n, k] = dlogits^T x
    p.m = w.head ? w.n : w.k, p.n = w.head ? w.k : w.n, p.k = rows;
    ta = true;
    a_rows = rows, a_cols = p.m;
    b_rows = rows, b_cols = p.n;
  }
  o.a32 = random_floats(a_rows * a_cols, 5);
  o.b32 = random_floats(b_rows * b_cols, 6);
  o.c.assign(static_cast<size_t>(p.m * p.n), 0.0f);
  if (dtype == DType::kBF16) {
    o.a16 = to_bf16(o.a32);
    o.b16 = to_bf16(o.b32);
  }
  p.a = GemmInput{dtype == DType::kBF16 ? static_cast<const void*>(o.a16.data()) : o.a32.data(), dtype, a_cols, ta};
  p.b = GemmInput{dtype == DType::kBF16 ? static_cast<const void*>(o.b16.data()) : o.b32.data(), dtype, b_cols, tb};
  p.c = o.c.data();
  p.ldc = p.n;
  o.scratch.assign(static_cast<size_t>(gemm_scratch_elements(p)), 0.0f);
}

void run_threads(const BenchContext& ctx, int64_t rows, int threads) {
  const int iters = std::max(ctx.options.iters / 4, 3);
  const int warmup = std::min(ctx.options.warmup, 1);
  const int64_t square = 2048;
  const double ours_peak = gemm_cpu_square_gflops(square, threads, iters);
  const double onednn_peak = onednn_square_gflops(square, threads, iters);
  const double peak = std::max(ours_peak, onednn_peak);
  const std::string t = "_" + std::to_string(threads) + "t";
  nlohmann::ordered_json row = {{"case", "peak_2048_fp32" + t},
                                {"value", round_to(ours_peak, 2)},
                                {"unit", "GFLOP/s"},
                                {"ref", "onednn_omp_2048_fp32"},
                                {"ref_value", round_to(onednn_peak, 2)},
                                {"ratio", round_to(ours_peak / onednn_peak, 3)},
                                {"better", "higher"},
                                {"threads", threads},
                                {"backend", gemm_describe()}};
  ctx.reporter.emit(row);
  ctx.reporter.note(detail::str("peak (", threads, " threads): 2048^3 fp32 ", ours_peak, " GFLOP/s via gemm_cpu, ",
                                onednn_peak, " via oneDNN's own OpenMP threading; ", gemm_describe()));
  const Weight weights[] = {{"768x2304", 768, 2304, false},
                            {"768x768", 768, 768, false},
                            {"768x3072", 768, 3072, false},
                            {"3072x768", 3072, 768, false},
                            {"768x50304", 768, 50304, true}};
  for (const Weight& w : weights) {
    double naive = 0;
    for (const char* layout : {"fwd", "dx", "dw"}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        Operands o;
        setup(o, w, rows, layout, dtype);
        GemmOptions opt;
        opt.threads = threads;
        opt.scratch = o.scratch.data();
        opt.scratch_elements = static_cast<int64_t>(o.scratch.size());
        const LocalTiming tm = time_local(warmup, iters, [&] { gemm_cpu(o.p, opt); });
        const double flops = 2.0 * static_cast<double>(o.p.m * o.p.n * o.p.k);
        const double gflops = flops / tm.median_s / 1e9;
        const GemmTiling tiling = gemm_tiling(o.p.m, o.p.n, o.p.k);
        nlohmann::ordered_json r = {
            {"case", detail::str(layout, "_", w.name, "_", dtype == DType::kF32 ? "fp32" : "bf16", t)},
            {"value", round_to(gflops, 2)},
            {"unit", "GFLOP/s"},
            {"ref", "peak_2048_fp32"},
            {"ref_value", round_to(peak, 2)},
            {"ratio", round_to(gflops / peak, 3)},
            {"better", "higher"},
            {"best_gflops", round_to(flops / tm.min_s / 1e9, 2)},
            {"ms", round_to(tm.median_s * 1e3, 3)},
            {"m", o.p.m},
            {"n", o.p.n},
            {"k", o.p.k},
            {"tiles", ((o.p.m + tiling.tile_m - 1) / tiling.tile_m) * ((o.p.n + tiling.tile_n - 1) / tiling.tile_n)},
            {"native_bf16", gemm_native_bf16()},
            {"threads", threads}};
        if (std::string(layout) == "fwd" && dtype == DType::kF32) {
          naive = naive_gflops(o.p.m, o.p.n, o.p.k, threads);
          r["naive_gflops"] = round_to(naive, 2);
          r["over_naive"] = round_to(gflops / naive, 2);
        }
        ctx.reporter.emit(r);
        ctx.reporter.note(detail::str(r["case"].get<std::string>(), ": ", gflops, " GFLOP/s = ", gflops / peak,
                                      " of peak", naive > 0 ? detail::str(" (naive loop ", naive, ")") : ""));
      }
    }
  }
}

}  // namespace

void run_gemm_suite(const BenchContext& ctx) {
  if (ctx.world.size() != 1) MP_THROW(ConfigError, "the gemm suite runs on one rank (-np 1)");
  const int64_t rows = ctx.options.sizes_bytes.empty() ? 256 : ctx.options.sizes_bytes.front();
  if (rows < 1 || rows > (1 << 16)) MP_THROW(ConfigError, "gemm suite: --sizes ", rows, ": rows in [1, 65536]");
  const int all = default_cpu_threads();
  run_threads(ctx, rows, 1);
  if (all > 1) run_threads(ctx, rows, all);
}

}  // namespace mp::bench

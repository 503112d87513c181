// bench/update_bench.cc: suite "update": the fused optimizer step against
// this machine's memory bandwidth, measured in the same run with a
// STREAM-like triad (a = b + s c) over buffers larger than the caches, on
// the same number of threads. Also times an unfused reference doing the
// same work in separate passes (unscale, update, cast), as a framework
// without a fused kernel would.
//
// Case adamw_fp32master_bf16grad_<N>_<T>t: AdamW, fp32 master, bf16
// gradients, fp32 moments, bf16 copy, N parameters, T threads. It moves 28
// bytes per parameter: read grad 2, master 4, m 4, v 4; write master 4, m 4,
// v 4, copy 2. value = achieved GB/s, ref = triad GB/s, ratio = value / ref
// (higher is better; the target is 0.8). Sizes via --sizes give the
// parameter count (e.g. 64M = 2^26 parameters). Launch with
// `launch/mprun -np 1 --bind-to none` (scripts/bench does): mpirun binds a
// rank to one core otherwise, and two threads then share it.
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "bench/suites.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/update.h"
#include "runtime/error.h"

namespace mp::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Runs body(begin, end) on `threads` contiguous slices of [0, n).
template <class F>
void parallel(int threads, int64_t n, F body) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int64_t b = n * t / threads, e = n * (t + 1) / threads;
    pool.emplace_back([=] { body(b, e); });
  }
  for (auto& th : pool) th.join();
}

template <class F>
double median_seconds(int iters, F run) {
  std::vector<double> s;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    run();
    s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

void run_case(const BenchContext& ctx, int64_t n, int threads) {
  std::vector<float> master(n, 0.01f), m(n, 0.0f), v(n, 0.0f), g32(n), a(n), b(n, 1.0f), c(n, 2.0f);
  std::vector<uint16_t> grad(n, math::f32_to_bf16_bits(0.5f)), copy(n);
  const int iters = std::max(ctx.options.iters / 4, 3);

  const double triad_s = median_seconds(iters, [&] {
    parallel(threads, n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + 3.0f * c[i];
    });
  });
  const double triad_gbps = 12.0 * static_cast<double>(n) / triad_s / 1e9;

  UpdateArgs base;
  base.adamw.bias_correction1 = 0.1f;
  base.adamw.bias_correction2_sqrt = 0.03f;
  base.grad_multiplier = 1.0f / 65536;
  auto fused = [&] {
    parallel(threads, n, [&](int64_t lo, int64_t hi) {
      UpdateArgs u = base;
      u.n = hi - lo;
      u.master = master.data() + lo;
      u.state0 = m.data() + lo;
      u.state1 = v.data() + lo;
      u.grad = grad.data() + lo;
      u.grad_dtype = DType::kBF16;
      u.param_out = copy.data() + lo;
      u.index_offset = static_cast<uint64_t>(lo);
      fused_update_cpu(u, false);
    });
  };
  const double fused_s = median_seconds(iters, fused);

  // Unfused: unscale into an fp32 gradient, update, cast: three passes.
  auto unfused = [&] {
    parallel(threads, n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) g32[i] = math::bf16_bits_to_f32(grad[i]) * base.grad_multiplier;
      for (int64_t i = lo; i < hi; ++i) math::adamw_element(master[i], m[i], v[i], g32[i], base.adamw);
      for (int64_t i = lo; i < hi; ++i) copy[i] = math::f32_to_bf16_bits(master[i]);
    });
  };
  const double unfused_s = median_seconds(iters, unfused);

  const double bytes = 28.0 * static_cast<double>(n);
  const double gbps = bytes / fused_s / 1e9;
  ctx.reporter.emit({{"case", "adamw_fp32master_bf16grad_" + size_label(n) + "_" + std::to_string(threads) + "t"},
                     {"value", round_to(gbps, 3)},
                     {"unit", "GB/s"},
                     {"ref", "stream_triad"},
                     {"ref_value", round_to(triad_gbps, 3)},
                     {"ratio", round_to(gbps / triad_gbps, 3)},
                     {"better", "higher"},
                     {"target", "ratio >= 0.8"},
                     {"target_met", gbps / triad_gbps >= 0.8},
                     {"bytes_per_param", 28},
                     {"fused_ms", round_to(fused_s * 1e3, 3)},
                     {"unfused_ms", round_to(unfused_s * 1e3, 3)},
                     {"unfused_over_fused", round_to(unfused_s / fused_s, 3)},
                     {"params", n},
                     {"threads", threads}});
  ctx.reporter.note("AdamW " + size_label(n) + " on " + std::to_string(threads) + " thread(s): " +
                    std::to_string(gbps) + " GB/s vs triad " + std::to_string(triad_gbps) + " GB/s");
}

}  // namespace

void run_update_suite(const BenchContext& ctx) {
  if (ctx.world.size() != 1) MP_THROW(ConfigError, "the update suite runs on one rank (-np 1)");
  std::vector<int64_t> sizes = ctx.options.sizes_bytes;
  if (sizes.empty()) sizes = {int64_t{1} << 26, int64_t{1} << 28};  // 64M and 256M parameters
  for (int64_t n : sizes) {
    for (int threads : {1, 2}) run_case(ctx, n, threads);
  }
}

}  // namespace mp::bench

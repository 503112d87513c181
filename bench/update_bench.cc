// bench/update_bench.cc: suite "update": the fused optimizer step against
// this machine's memory bandwidth, measured in the same run with a
// STREAM-like triad (a = b + s c, 12 bytes per element as STREAM counts
// them) over buffers larger than the caches, vectorized, on the same number
// of threads and the same thread pool. Also times an unfused reference
// doing the same work in separate passes (unscale, clip, update, cast), as
// a framework without a fused kernel would, and the scalar (unvectorized)
// build of the fused loop.
//
// Cases adamw_<mode>_bf16grad_<N>_<T>t: AdamW with bf16 gradients and fp32
// moments, N parameters, T threads, for the three master modes:
//   fp32master   master 4 r+w, bf16 copy written: 2 + 8 + 16 + 2 = 28 bytes/param
//   bf16rem      bf16 half and int16 remainder r+w: 2 + 8 + 16 = 26
//   pure_bf16    bf16 parameter r+w (no master):   2 + 4 + 16 = 22
// value = achieved GB/s (bytes_per_param x N / time), ref = triad GB/s,
// ratio = value / ref (higher is better; the target is 0.8 for
// fp32master on 1 and 2 threads). Sizes via --sizes give the parameter count
// (64M = 2^26 parameters). Launch with `launch/mprun -np 1 --bind-to none`
// (scripts/bench does): mpirun binds a rank to one core otherwise.
#include <algorithm>
#include <string>
#include <vector>

#include "bench/suites.h"
#include "bench/timing.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/update.h"

namespace mp::bench {
namespace {

struct Mode {
  const char* name;
  MasterMode mode;
};

void run_case(const BenchContext& ctx, int64_t n, int threads) {
  std::vector<float> master(n, 0.01f), m(n, 0.0f), v(n, 0.0f), g32(n);
  std::vector<uint16_t> grad(n, math::f32_to_bf16_bits(0.5f)), copy(n, math::f32_to_bf16_bits(0.01f));
  std::vector<int16_t> remainder(n, 0);
  const int iters = std::max(ctx.options.iters / 4, 3);
  const int warmup = std::min(ctx.options.warmup, 1);

  const double triad_gbps = stream_triad_gbps(n, threads, warmup, iters);

  StepScalars scalars;
  scalars.step = 10;
  scalars.grad_multiplier = 1.0f / 65536;
  const float clip = 0.5f;
  for (const Mode& mode : {Mode{"fp32master", MasterMode::kFp32}, Mode{"bf16rem", MasterMode::kBf16Remainder},
                           Mode{"pure_bf16", MasterMode::kNone}}) {
    UpdateArgs u;
    u.hyper.weight_decay = 0.1f;
    u.n = n;
    u.master_mode = mode.mode;
    u.master = mode.mode == MasterMode::kFp32 ? master.data() : nullptr;
    u.master_remainder = mode.mode == MasterMode::kBf16Remainder ? remainder.data() : nullptr;
    u.state0 = m.data();
    u.state1 = v.data();
    u.grad = grad.data();
    u.grad_dtype = DType::kBF16;
    u.param_out = copy.data();
    u.threads = threads;
    const double fused_s = time_local(warmup, iters, [&] { fused_update_cpu(u, scalars); }).median_s;
    const int64_t bytes_per_param = update_bytes_per_param(u);
    const double gbps = static_cast<double>(bytes_per_param * n) / fused_s / 1e9;
    nlohmann::ordered_json row = {
        {"case", std::string("adamw_") + mode.name + "_bf16grad_" + size_label(n) + "_" + std::to_string(threads) + "t"},
        {"value", round_to(gbps, 3)},
        {"unit", "GB/s"},
        {"ref", "stream_triad"},
        {"ref_value", round_to(triad_gbps, 3)},
        {"ratio", round_to(gbps / triad_gbps, 3)},
        {"better", "higher"}};
    if (mode.mode == MasterMode::kFp32) {
      row["target"] = "ratio >= 0.8";
      row["target_met"] = gbps / triad_gbps >= 0.8;
      // Unfused: unscale into an fp32 gradient, clip it, update, cast.
      const math::AdamW::Step k = math::step_constants<math::AdamW>(u.hyper, scalars, 1.0f, 1.0f);
      const double unfused_s = time_local(warmup, iters, [&] {
        parallel_for(n, threads, 64, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) g32[i] = math::bf16_bits_to_f32(grad[i]) * scalars.grad_multiplier;
          for (int64_t i = lo; i < hi; ++i) g32[i] *= clip;
          for (int64_t i = lo; i < hi; ++i) math::AdamW::element(master[i], m[i], v[i], g32[i], k);
          for (int64_t i = lo; i < hi; ++i) copy[i] = math::f32_to_bf16_bits(master[i]);
        });
      }).median_s;
      row["unfused_ms"] = round_to(unfused_s * 1e3, 3);
      row["unfused_over_fused"] = round_to(unfused_s / fused_s, 3);
    }
    UpdateArgs scalar = u;
    scalar.isa = CpuIsa::kScalar;
    const double scalar_s = time_local(warmup, iters, [&] { fused_update_cpu(scalar, scalars); }).median_s;
    row["scalar_ms"] = round_to(scalar_s * 1e3, 3);
    row["scalar_over_fused"] = round_to(scalar_s / fused_s, 3);
    row["bytes_per_param"] = bytes_per_param;
    row["fused_ms"] = round_to(fused_s * 1e3, 3);
    row["isa"] = std::string(cpu_isa_name(cpu_isa_best()));
    row["params"] = n;
    row["threads"] = threads;
    ctx.reporter.emit(row);
    ctx.reporter.note(std::string("AdamW ") + mode.name + " " + size_label(n) + " on " + std::to_string(threads) +
                      " thread(s): " + std::to_string(gbps) + " GB/s vs triad " + std::to_string(triad_gbps) +
                      " GB/s");
  }
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

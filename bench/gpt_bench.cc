// bench/gpt_bench.cc: suite "gpt": GPT training throughput through the real
// engine (runtime/engine.h) over MPI, FULL_SHARD, against this machine's
// GEMM peak measured in the same run.
//
// Models (the context is the sequence length T: our GPT's wpe has exactly
// `context` rows, so "T = 64 of GPT-2's 1024 positions" is context 64, as
// llm.c's B = 4, T = 64 benchmark runs):
//   gpt2_124m  vocab 50257 (padded to 50304), context 64, channels 768,
//              12 heads, 12 layers, global batch 4 sequences
//   small      vocab 256, context 64, channels 128, 4 heads, 4 layers,
//              global batch 8
// Each rank runs one micro-batch of global_batch / ranks sequences per step.
// Recipes: bf16_master with bf16 GEMMs (matmul_dtype bf16: Note [GPT
// autocast] in models/gpt.h), and fp32 with fp32 GEMMs.
//
// Per case: the median step time over the timed steps (rank 0's clock;
// every step ends in collectives, so all ranks finish together), tokens/s =
// global batch x T / step time, and the model FLOP/s by nanoGPT's and
// llm.c's MFU estimate: 6 N + 12 L C T FLOPs per token, N the parameters
// without wpe and without the vocabulary padding (gpt_train_flops_per_token
// in models/gpt.h, as in mp_worker). value = model GFLOP/s,
// ref = the GEMM peak of the whole job in the case's GEMM dtype (Note [GEMM
// peak reference] in bench/gemm_peak.h): every rank times the same GEMMs
// through gemm_cpu (fp32, or bf16 in with fp32 accumulation for the bf16
// cases) on its threads at the same time, large squares and each GEMM of
// a GPT-2 124M step, best of a few each, summed over ranks, the best
// shape; ratio = the fraction of that peak the training achieves. Beside
// it, fma_peak: the theoretical peak of the job's cores (bench/cpu_peak.h).
//
// Profile (rank 0, mean per timed step; Note [Op profile] in
// kernels/op_profile.h): the model's compute by op family (gemm,
// layernorm, attention, gelu, softmax_xent, embedding, cast, elementwise),
// what compute has beyond them (other_compute_ms), and idle_ms = step -
// compute - update - exposed communication (neither stream busy nor
// waiting for a collective). gemm_kernel: the kernel family oneDNN picks
// for the case's GEMM dtype on this CPU. ops_per_step (model_ops_per_step):
// the ops a step enqueues on rank 0, the model's and the engine's (Note [Op
// count] in kernels/op_profile.h): on a GPU, its kernel launches.
//
// MP_BENCH_DATA_PLANE=gloo trains over the Gloo backend (comm/gloo/) instead
// of MPI (bench/gloo_vs_mpi.sh runs both).
// Threads per rank: MP_NUM_THREADS if set, else the CPUs this rank may run
// on divided by the ranks on the node (launch with --bind-to none).
// --sizes B: the global batch of both models (default 4 and 8).
// --iters N: timed steps (default: 5 for gpt2_124m, 20 for small);
// --warmup N: untimed steps first (at most 2 for gpt2_124m).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bench/cpu_peak.h"
#include "bench/gemm_peak.h"
#include "bench/gpt_setup.h"
#include "bench/suites.h"
#include "bench/timing.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/update.h"
#include "kernels/op_profile.h"
#include "models/gpt.h"
#include "runtime/engine.h"
#include "runtime/precision.h"

namespace mp::bench {
namespace {

using Clock = std::chrono::steady_clock;
using SC = proto::ShardingConfig;

// The job's GEMM peak in `dtype` (Note [GEMM peak reference]), and the
// theoretical FMA peak of all ranks' cores beside it.
struct JobPeak {
  GemmPeak measured;
  double fma_gflops = 0;
  std::string fma_basis;  // rank 0's
};

JobPeak job_gemm_peak(int threads, DType dtype, int ranks) {
  JobPeak p;
  p.measured = gemm_cpu_peak(threads, 3, MPI_COMM_WORLD, dtype);
  const CpuPeak fma = cpu_fma_peak(threads, dtype);
  p.fma_gflops = fma.gflops * ranks;
  p.fma_basis = detail::str(ranks, " rank(s) x ", fma.basis);
  return p;
}

std::string describe(const JobPeak& p, DType dtype) {
  return detail::str(dtype_name(dtype), " ", p.measured.gflops, " GFLOP/s (", p.measured.best, ", ",
                     gemm_kernel(dtype), "; theoretical ", p.fma_gflops, ": ", p.fma_basis, ")");
}

// Bytes one AdamW step moves over n parameters of a recipe's shard.
double update_bytes(int64_t n, DType matmul) {
  static bf16 copy;
  UpdateArgs u;
  u.master_mode = MasterMode::kFp32;
  u.state_dtype = DType::kF32;
  u.grad_dtype = DType::kF32;
  u.param_out = matmul == DType::kBF16 ? &copy : nullptr;
  u.param_dtype = DType::kBF16;
  return static_cast<double>(update_bytes_per_param(u) * n);
}

struct Model {
  std::string name;
  GptConfig gpt;
  int64_t global_batch;
  int default_steps;
  int max_warmup;
};

struct Recipe {
  std::string name;
  DType matmul;
};

}  // namespace

void run_gpt_suite(const BenchContext& ctx) {
  auto world = bench_world("bench");  // MP_BENCH_DATA_PLANE=gloo: over Gloo
  const int ranks = world->size();
  const int threads = threads_per_rank(ctx.world);
  const GptConfig big = gpt2_124m_bench_config(), small = small_gpt_bench_config();
  const bool batch_given = !ctx.options.sizes_bytes.empty();
  const int64_t given = batch_given ? ctx.options.sizes_bytes.front() : 0;
  std::vector<Model> models = {{"gpt2_124m", big, batch_given ? given : 4, 5, 2},
                               {"small", small, batch_given ? given : 8, 20, 1000}};
  const JobPeak job_fp32 = job_gemm_peak(threads, DType::kF32, ranks);
  const JobPeak job_bf16 = job_gemm_peak(threads, DType::kBF16, ranks);
  const double peak_fp32 = job_fp32.measured.gflops, peak_bf16 = job_bf16.measured.gflops;
  ctx.reporter.note(detail::str(ranks, " rank(s) x ", threads, " thread(s); GEMM peak of the job (best of ",
                                job_fp32.measured.all.size(), " GEMMs, summed over ranks): ",
                                describe(job_fp32, DType::kF32), "; ", describe(job_bf16, DType::kBF16), "; ",
                                gemm_describe()));
  for (const JobPeak* p : {&job_fp32, &job_bf16}) {
    nlohmann::ordered_json j;
    const DType dt = p == &job_fp32 ? DType::kF32 : DType::kBF16;
    j["case"] = "gemm_peak_" + std::string(dtype_name(dt));
    j["value"] = round_to(p->measured.gflops, 2);
    j["unit"] = "GFLOP/s";
    j["ref"] = "fma_peak";
    j["ref_value"] = round_to(p->fma_gflops, 2);
    j["ratio"] = round_to(p->measured.gflops / p->fma_gflops, 4);
    j["better"] = "higher";
    j["best_shape"] = p->measured.best;
    nlohmann::ordered_json shapes;
    for (const auto& [name, g] : p->measured.all) shapes[name] = round_to(g, 2);
    j["shapes"] = shapes;
    j["fma_basis"] = p->fma_basis;
    j["ranks"] = ranks;
    j["threads_per_rank"] = threads;
    ctx.reporter.emit(j);
  }
  // The update's reference: this rank's STREAM triad, all ranks at once.
  const double triad_gbps = stream_triad_gbps(int64_t{1} << 25, threads, 1, 5, MPI_COMM_WORLD);
  op_profile_enable(true);
  for (const Model& m : models) {
    if (m.global_batch % ranks != 0) {
      MP_THROW(ConfigError, "gpt suite: global batch ", m.global_batch, " does not divide over ", ranks, " ranks");
    }
    for (const Recipe& r : {Recipe{"bf16_master", DType::kBF16}, Recipe{"fp32", DType::kF32}}) {
      GptConfig g = m.gpt;
      g.micro_batch_size = m.global_batch / ranks;
      g.threads = threads;
      g.matmul_dtype = r.matmul;
      proto::EngineConfig config;
      config.mutable_sharding()->set_strategy(SC::FULL_SHARD);
      *config.mutable_precision() = precision_recipe(r.name);
      config.set_micro_batches(1);
      Allocator allocator;
      Gpt model(g, allocator);
      Engine engine(model.spec(), config, *world, allocator);
      const int warmup = std::min(ctx.options.warmup, m.max_warmup);
      const int steps = ctx.options.iters == BenchOptions{}.iters ? m.default_steps : ctx.options.iters;
      for (int i = 0; i < warmup; ++i) engine.step(model);
      std::vector<double> times, compute, exposed, update, idle;
      double loss = 0;
      (void)op_profile_take();
      (void)op_count_take();
      for (int i = 0; i < steps; ++i) {
        const auto t0 = Clock::now();
        const StepResult s = engine.step(model);
        times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        compute.push_back(s.timings.compute_s);
        exposed.push_back(s.timings.exposed_comm_s);
        update.push_back(s.timings.update_s);
        idle.push_back(times.back() - s.timings.compute_s - s.timings.exposed_comm_s - s.timings.update_s);
        loss = s.loss;
      }
      const OpProfile profile = op_profile_take();
      const OpCount ops = op_count_take();
      const double peak = r.matmul == DType::kBF16 ? peak_bf16 : peak_fp32;
      const double step_s = median(times), best_s = *std::min_element(times.begin(), times.end());
      const double tokens = static_cast<double>(m.global_batch * g.context);
      const double model_gflops = gpt_train_flops_per_token(g) * tokens / step_s / 1e9;
      nlohmann::ordered_json j;
      j["case"] = m.name + "_" + r.name;
      j["value"] = round_to(model_gflops, 2);
      j["unit"] = "GFLOP/s";
      j["ref"] = r.matmul == DType::kBF16 ? "gemm_peak_bf16" : "gemm_peak_fp32";
      j["ref_value"] = round_to(peak, 2);
      j["ratio"] = round_to(model_gflops / peak, 4);
      j["better"] = "higher";
      j["tokens_per_s"] = round_to(tokens / step_s, 2);
      j["best_tokens_per_s"] = round_to(tokens / best_s, 2);
      j["step_ms"] = round_to(step_s * 1e3, 2);
      j["compute_ms"] = round_to(median(compute) * 1e3, 2);
      j["exposed_comm_ms"] = round_to(median(exposed) * 1e3, 2);
      j["update_ms"] = round_to(median(update) * 1e3, 2);
      j["idle_ms"] = round_to(median(idle) * 1e3, 2);
      // The update's bytes (this rank's shard, AdamW, fp32 master and
      // states, fp32 gradients, the bf16 copy for bf16_master) over its
      // time, statistics pass included, against the triad.
      const double update_gbps = update_bytes(model.spec().numel() / ranks, r.matmul) / median(update) / 1e9;
      j["update_gbps"] = round_to(update_gbps, 2);
      j["triad_gbps"] = round_to(triad_gbps, 2);
      j["update_over_triad"] = round_to(update_gbps / triad_gbps, 3);
      nlohmann::ordered_json prof;
      double profiled_ms = 0;
      for (int f = 0; f < kNumOpFamilies; ++f) {
        const double ms = profile.seconds[static_cast<size_t>(f)] * 1e3 / steps;
        prof[std::string(op_family_name(static_cast<OpFamily>(f)))] = round_to(ms, 2);
        profiled_ms += ms;
      }
      j["profile_ms"] = prof;
      // Note [Op count]: the ops a step enqueues, the model's and the engine's.
      j["ops_per_step"] = ops.total() / steps;
      j["model_ops_per_step"] = ops.model / steps;
      j["other_compute_ms"] = round_to(std::accumulate(compute.begin(), compute.end(), 0.0) * 1e3 / steps - profiled_ms, 2);
      j["non_gemm_fraction"] =
          round_to(1.0 - profile.seconds[0] / std::max(1e-12, std::accumulate(compute.begin(), compute.end(), 0.0)), 3);
      j["gemm_kernel"] = gemm_kernel(r.matmul);
      j["fp32_peak"] = round_to(peak_fp32, 2);
      j["bf16_peak"] = round_to(peak_bf16, 2);
      const JobPeak& job = r.matmul == DType::kBF16 ? job_bf16 : job_fp32;
      j["fma_peak"] = round_to(job.fma_gflops, 2);
      j["over_fma_peak"] = round_to(model_gflops / job.fma_gflops, 4);
      j["params"] = model.spec().numel();
      j["flops_per_token"] = gpt_train_flops_per_token(g);
      j["global_batch"] = m.global_batch;
      j["seq"] = g.context;
      j["matmul_dtype"] = std::string(dtype_name(g.matmul_dtype));
      j["native_bf16"] = gemm_native_bf16();
      j["bf16_gemm"] = gemm_bf16_reason();
      j["loss"] = round_to(loss, 4);
      j["ranks"] = ranks;
      j["threads_per_rank"] = threads;
      j["steps"] = steps;
      ctx.reporter.emit(j);
      ctx.reporter.note(detail::str(j["case"].get<std::string>(), ": ", tokens / step_s, " tokens/s, step ",
                                    step_s * 1e3, " ms (compute ", median(compute) * 1e3, ", exposed comm ",
                                    median(exposed) * 1e3, ", update ", median(update) * 1e3, "), ", model_gflops,
                                    " GFLOP/s = ", model_gflops / peak, " of the ", dtype_name(r.matmul),
                                    " GEMM peak; non-GEMM share of compute ", j["non_gemm_fraction"].get<double>(),
                                    ", idle ", median(idle) * 1e3, " ms"));
    }
  }
}

}  // namespace mp::bench

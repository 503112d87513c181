// bench/muon_bench.cc: suite "muon": what optimizer kind MUON adds to a
// GPT training step through the engine (FULL_SHARD, bf16_master, bf16
// GEMMs), against the bound its Newton-Schulz iterations set.
//
// Models as suite "gpt" (bench/gpt_bench.cc): gpt2_124m (global batch 4,
// T 64) and small (global batch 8). Per model, five engines train the same
// model side by side: AdamW, and MUON with bf16 and with fp32 iterations,
// after the backward; then AdamW and MUON bf16 with
// sharding.optimizer_in_backward (case suffix _in_backward: the iterations
// overlap the backward, Note [Muon overlapped]). Their timed steps are
// interleaved, so a slow moment of the shared machine hits all five.
//
// Per Muon case:
//   value      = extra_ms: the median Muon step minus the median AdamW step
//                (AdamW with the same optimizer_in_backward);
//   ref_value  = bound_ms: the step's Newton-Schulz FLOPs (muon_ns_flops
//                over every matrix: ns_steps x (4 m^2 n + 2 m^3)) over the
//                job's GEMM peak in the iteration dtype, measured in the
//                same run (Note [GEMM peak reference] in bench/gemm_peak.h:
//                summed over ranks, so the bound is what spreading the
//                matrices perfectly over the ranks would cost);
//   ratio      = extra / bound (lower is better; 1 is the bound).
// Beside it: ns_isolated_ms, the owner part alone (muon_orthogonalize_cpu
// on the matrices each rank owns, the same shapes and threads, the busiest
// rank), what the extra time would be if the exchange and the element
// passes were free; and hidden_fraction = max(0, 1 - extra / isolated):
// how much of the iterations the step hides behind other work. (On a CPU
// the iterations and the backward share the same cores.)
//
// --iters N: timed steps per engine (default 3 for gpt2_124m, 10 for
// small); --warmup N: untimed steps first (default 1).

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/gemm_peak.h"
#include "bench/gpt_setup.h"
#include "bench/suites.h"
#include "bench/timing.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm.h"
#include "models/gpt.h"
#include "optim/muon.h"
#include "optim/optimizer.h"
#include "runtime/engine.h"
#include "runtime/muon_plan.h"
#include "runtime/precision.h"

namespace mp::bench {
namespace {

using Clock = std::chrono::steady_clock;

proto::EngineConfig config_for(proto::OptimizerConfig::Kind kind, proto::DataType iteration, bool in_backward) {
  proto::EngineConfig c;
  c.mutable_sharding()->set_strategy(proto::ShardingConfig::FULL_SHARD);
  c.mutable_sharding()->set_optimizer_in_backward(in_backward);
  *c.mutable_precision() = precision_recipe("bf16_master");
  c.set_micro_batches(1);
  c.mutable_optimizer()->set_kind(kind);
  if (kind == proto::OptimizerConfig::MUON) {
    c.mutable_optimizer()->set_lr(0.02);
    c.mutable_optimizer()->mutable_muon()->set_iteration_dtype(iteration);
  }
  return c;
}

// The owner part alone on the matrices this rank owns: seconds, the median
// of `iters`, the slowest rank.
double isolated_ns_seconds(const ModelSpec& spec, const MuonHyper& hyper, int ranks, int rank, int threads,
                           int iters) {
  const FlatLayout layout(spec, ranks);
  std::vector<MuonMatrixInfo> mine;
  for (const MuonMatrixInfo& m : muon_matrices(layout, hyper, ranks)) {
    if (m.owner == rank) mine.push_back(m);
  }
  // Inputs and buffers first: only the iterations are timed.
  std::vector<std::vector<float>> u(mine.size()), o(mine.size());
  std::vector<float> scratch;
  for (size_t k = 0; k < mine.size(); ++k) {
    const int64_t n = mine[k].rows * mine[k].cols;
    u[k].resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) u[k][static_cast<size_t>(i)] = static_cast<float>((i * 7919 % 1013) - 506) * 1e-3f;
    o[k].resize(static_cast<size_t>(n));
    scratch.resize(std::max(scratch.size(),
                            static_cast<size_t>(muon_owner_scratch_elements(mine[k].rows, mine[k].cols, hyper))));
  }
  std::vector<double> times;
  for (int it = 0; it < iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = Clock::now();
    for (size_t k = 0; k < mine.size(); ++k) {
      muon_orthogonalize_cpu(hyper, u[k].data(), mine[k].rows, mine[k].cols, o[k].data(), threads, scratch.data(),
                             static_cast<int64_t>(scratch.size()));
    }
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times.push_back(s);
  }
  return median(times);
}

struct Case {
  proto::DataType iteration;
  bool in_backward;  // sharding.optimizer_in_backward: the iterations beside the backward
};

struct Model {
  std::string name;
  GptConfig gpt;
  int64_t global_batch;
  int default_steps;
};

}  // namespace

void run_muon_suite(const BenchContext& ctx) {
  auto world = MpiCommunicator::create_world("bench", CommOptions{});
  const int ranks = world->size();
  const int threads = threads_per_rank(ctx.world);
  set_default_cpu_threads(threads);  // the engine's Newton-Schulz and loops, as mp_worker does
  const GptConfig big = gpt2_124m_bench_config(), small = small_gpt_bench_config();
  const std::vector<Model> models = {{"gpt2_124m", big, 4, 3}, {"small", small, 8, 10}};
  const GemmPeak peak_fp32 = gemm_cpu_peak(threads, 3, MPI_COMM_WORLD, DType::kF32);
  const GemmPeak peak_bf16 = gemm_cpu_peak(threads, 3, MPI_COMM_WORLD, DType::kBF16);
  ctx.reporter.note(detail::str(ranks, " rank(s) x ", threads, " thread(s); GEMM peak of the job: fp32 ",
                                peak_fp32.gflops, " GFLOP/s (", peak_fp32.best, "), bf16 ", peak_bf16.gflops,
                                " GFLOP/s (", peak_bf16.best, "); ", gemm_describe()));
  const std::vector<Case> cases = {{proto::BF16, false}, {proto::FP32, false}, {proto::BF16, true}};
  for (const Model& m : models) {
    if (m.global_batch % ranks != 0) {
      MP_THROW(ConfigError, "muon suite: global batch ", m.global_batch, " does not divide over ", ranks, " ranks");
    }
    GptConfig g = m.gpt;
    g.micro_batch_size = m.global_batch / ranks;
    g.threads = threads;
    g.matmul_dtype = DType::kBF16;
    Allocator allocator;
    Gpt model(g, allocator);
    // Engine 0: AdamW; then Muon, one per case; each case's baseline is
    // AdamW with the same optimizer_in_backward.
    std::vector<std::unique_ptr<Engine>> engines;
    for (const bool in_backward : {false, true}) {
      engines.push_back(std::make_unique<Engine>(
          model.spec(), config_for(proto::OptimizerConfig::ADAMW, proto::BF16, in_backward), *world, allocator));
    }
    for (const Case& c : cases) {
      engines.push_back(std::make_unique<Engine>(
          model.spec(), config_for(proto::OptimizerConfig::MUON, c.iteration, c.in_backward), *world, allocator));
    }
    const int steps = ctx.options.iters == BenchOptions{}.iters ? m.default_steps : ctx.options.iters;
    for (int i = 0; i < std::min(ctx.options.warmup, 1); ++i) {
      for (auto& e : engines) e->step(model);
    }
    std::vector<std::vector<double>> times(engines.size());
    std::vector<double> losses(engines.size());
    for (int i = 0; i < steps; ++i) {
      for (size_t k = 0; k < engines.size(); ++k) {
        const auto t0 = Clock::now();
        losses[k] = engines[k]->step(model).loss;
        times[k].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
    double ns_flops = 0;
    for (const UnitSpec& u : model.spec().units) {
      for (const ParamSpec& p : u.params) {
        if (p.muon) ns_flops += muon_ns_flops(p.shape[0], p.shape[1], MuonHyper{}.ns_steps);
      }
    }
    for (size_t k = 0; k < cases.size(); ++k) {
      const size_t base = cases[k].in_backward ? 1 : 0, at = k + 2;
      const Engine& e = *engines[at];
      const MuonHyper& hyper = e.optimizer().muon()->hyper;
      const DType dt = hyper.iteration_dtype;
      const double peak = (dt == DType::kBF16 ? peak_bf16 : peak_fp32).gflops;
      const double adamw_s = median(times[base]), muon_s = median(times[at]);
      const double extra_s = muon_s - adamw_s;
      const double bound_s = ns_flops / (peak * 1e9);
      const double isolated_s = isolated_ns_seconds(model.spec(), hyper, ranks, world->rank(), threads, 3);
      nlohmann::ordered_json j;
      j["case"] = m.name + "_muon_" + std::string(dtype_name(dt)) + (cases[k].in_backward ? "_in_backward" : "");
      j["value"] = round_to(extra_s * 1e3, 2);
      j["unit"] = "ms";
      j["ref"] = "ns_bound";
      j["ref_value"] = round_to(bound_s * 1e3, 2);
      j["ratio"] = round_to(extra_s / bound_s, 3);
      j["better"] = "lower";
      j["adamw_step_ms"] = round_to(adamw_s * 1e3, 2);
      j["muon_step_ms"] = round_to(muon_s * 1e3, 2);
      j["ns_isolated_ms"] = round_to(isolated_s * 1e3, 2);
      j["ns_isolated_over_bound"] = round_to(isolated_s / bound_s, 3);
      j["hidden_fraction"] = round_to(std::max(0.0, 1.0 - extra_s / isolated_s), 3);
      j["ns_gflop_per_step"] = round_to(ns_flops / 1e9, 2);
      j["iteration_dtype"] = std::string(dtype_name(dt));
      j["gemm_peak_gflops"] = round_to(peak, 2);
      j["gemm_peak_shape"] = (dt == DType::kBF16 ? peak_bf16 : peak_fp32).best;
      j["optimizer_in_backward"] = cases[k].in_backward;
      j["loss_adamw"] = round_to(losses[base], 4);
      j["loss_muon"] = round_to(losses[at], 4);
      j["ranks"] = ranks;
      j["threads_per_rank"] = threads;
      j["steps"] = steps;
      ctx.reporter.emit(j);
      ctx.reporter.note(detail::str(j["case"].get<std::string>(), ": Muon adds ", extra_s * 1e3, " ms to a ",
                                    adamw_s * 1e3, " ms AdamW step; bound ", bound_s * 1e3, " ms (",
                                    ns_flops / 1e9, " GFLOP at ", peak, " GFLOP/s), ratio ", extra_s / bound_s,
                                    "; the iterations alone ", isolated_s * 1e3, " ms on the busiest rank"));
    }
  }
}

}  // namespace mp::bench

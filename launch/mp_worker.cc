// launch/mp_worker.cc: the training worker, one process per rank:
//   mpirun -np N build/mp_worker      (or launch/mprun -np N build/mp_worker)
// Exit codes: 0 success, 2 bad configuration or input, 1 runtime failure.
// Errors are printed on every rank that saw them, prefixed "[rank R]"; a
// failing rank then aborts the job so no other rank waits for it forever.
#include <CLI/CLI.hpp>
#include <dnnl.h>
#include <google/protobuf/stubs/common.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "comm/comm_config.h"
#include "comm/mpi/mpi_communicator.h"
#include "launch/mpi_world.h"
#include "launch/rank_info.h"
#include "launch/rank_main.h"
#include "models/mlp.h"
#include "mp/config.h"
#include "runtime/engine.h"
#include "runtime/error.h"
#include "runtime/memory_plan.h"
#if MP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if MP_WITH_NCCL
#include <nccl.h>
#endif

namespace mp {
namespace {

void print_version() {
  const dnnl_version_t* dnnl = dnnl_version();
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int mpi_len = 0;
  MPI_Get_library_version(mpi, &mpi_len);
  std::string mpi_first_line(mpi, static_cast<size_t>(mpi_len));
  mpi_first_line = mpi_first_line.substr(0, mpi_first_line.find_first_of(",\n"));
  std::cout << "mp_worker " << MP_VERSION << "\n"
            << "build: " << build_string() << "\n"
            << "oneDNN " << dnnl->major << "." << dnnl->minor << "." << dnnl->patch << "\n"
            << "MPI: " << mpi_first_line << "\n"
            << "protobuf " << google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION)
            << "\n";
#if MP_WITH_CUDA
  std::cout << "CUDA runtime " << CUDART_VERSION / 1000 << "." << (CUDART_VERSION % 1000) / 10
            << " (compiled)\n";
#endif
#if MP_WITH_NCCL
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    std::cout << "NCCL " << nccl / 10000 << "." << (nccl / 100) % 100 << "." << nccl % 100 << "\n";
  }
#endif
}

// What the command line asks for (issue 6 replaces the model flags with
// TrainConfig).
struct WorkerOptions {
  int steps = 30;
  std::string strategy = "FULL_SHARD";
  std::string recipe = "bf16_master";
  int micro_batches = 1;
  int prefetch_depth = 1;
  int hybrid_shard_size = 0;
  std::vector<int64_t> mlp_dims = {64, 256, 256, 256, 16};
  int64_t micro_batch_size = 32;
  double lr = 3e-3;
  bool deterministic = false;
  bool plan = false;        // print the memory plan for plan_world_size ranks and exit
  int plan_world_size = 1;
  bool plan_all = false;
};

proto::EngineConfig engine_config(const WorkerOptions& w) {
  proto::EngineConfig c;
  c.mutable_sharding()->set_strategy(parse_strategy(w.strategy));
  c.mutable_sharding()->set_prefetch_depth(w.prefetch_depth);
  if (w.hybrid_shard_size > 0) c.mutable_sharding()->set_hybrid_shard_size(w.hybrid_shard_size);
  *c.mutable_precision() = precision_recipe(w.recipe);
  c.mutable_optimizer()->set_lr(w.lr);
  c.set_micro_batches(w.micro_batches);
  c.set_deterministic(w.deterministic);
  c.set_seed(1);
  return c;
}

MlpConfig mlp_config(const WorkerOptions& w) {
  MlpConfig m;
  m.dims = w.mlp_dims;
  m.micro_batch_size = w.micro_batch_size;
  return m;
}

// --plan: the long-lived bytes per category of one rank, without running.
int print_plan(const WorkerOptions& w) {
  const ModelSpec spec = Mlp::spec_for(mlp_config(w));
  if (w.plan_all) {
    std::printf("bytes per parameter per rank, MLP of %lld parameters, world size %d\n%-16s",
                static_cast<long long>(spec.numel()), w.plan_world_size, "strategy");
    for (const std::string& r : precision_recipe_names()) std::printf(" %14s", r.c_str());
    std::printf("\n");
    for (const char* s : {"NO_SHARD", "SHARD_OPTIMIZER", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD"}) {
      std::printf("%-16s", s);
      for (const std::string& r : precision_recipe_names()) {
        WorkerOptions o = w;
        o.strategy = s;
        o.recipe = r;
        if (std::string(s) == "HYBRID_SHARD" && o.hybrid_shard_size == 0) o.hybrid_shard_size = std::min(8, w.plan_world_size);
        std::printf(" %14.4f", plan_memory(spec, engine_config(o), w.plan_world_size).total_bytes_per_param());
      }
      std::printf("\n");
    }
    return 0;
  }
  const MemoryPlan plan = plan_memory(spec, engine_config(w), w.plan_world_size);
  std::printf("memory plan: MLP of %lld parameters, %s, recipe %s, world size %d\n%s",
              static_cast<long long>(plan.params), w.strategy.c_str(), w.recipe.c_str(), w.plan_world_size,
              plan.to_string().c_str());
  return 0;
}

int run(const MpiWorld& world, const WorkerOptions& w) {
  const Device device = default_device(world.local_rank());
  set_current_device(device);
  const auto infos = gather_rank_infos(world, local_rank_info(world, device));
  if (world.rank() == 0) {
    std::cout << build_string() << ": " << world.size() << " rank(s)\n";
    for (const auto& info : infos) {
      std::cout << "  rank " << info.rank() << ": " << info.hostname() << " pid " << info.pid()
                << ", local rank " << info.local_rank() << "/" << info.local_size() << ", "
                << info.device_description();
      if (!info.cuda_unavailable_reason().empty()) {
        std::cout << " [CUDA unavailable: " << info.cuda_unavailable_reason() << "]";
      }
      std::cout << "\n";
    }
  }
  // The sharded engine trains the built-in MLP on the CPU (the GPT model,
  // its data and CUDA compute arrive with issue 6).
  const proto::EngineConfig config = engine_config(w);
  auto comm = MpiCommunicator::create_world("world", comm_options_from_config(config.comm()));
  Mlp model(mlp_config(w));
  Engine engine(model.spec(), config, *comm);
  if (world.rank() == 0) {
    std::printf("training an MLP of %lld parameters: %s, %s, %d micro-batch(es) of %lld per rank\n%s",
                static_cast<long long>(model.spec().numel()), w.strategy.c_str(),
                engine.options().precision.describe().c_str(), w.micro_batches,
                static_cast<long long>(w.micro_batch_size), engine.plan().to_string().c_str());
  }
  for (int s = 0; s < w.steps; ++s) {
    const StepResult r = engine.step(model);
    if (world.rank() == 0 && (s % 5 == 0 || s + 1 == w.steps)) {
      std::printf("step %4lld  loss %.5f  grad_norm %.4f  lr %.2e%s  step %.1f ms (compute %.1f, exposed comm %.1f, "
                  "update %.1f)\n",
                  static_cast<long long>(r.step), r.loss, r.grad_norm, r.lr, r.skipped ? "  skipped" : "",
                  1e3 * r.timings.total_s, 1e3 * r.timings.compute_s, 1e3 * r.timings.exposed_comm_s,
                  1e3 * r.timings.update_s);
      std::fflush(stdout);
    }
  }
  if (world.rank() == 0) std::printf("measured: %s\n", engine.memory().to_string().c_str());
  return 0;
}

}  // namespace
}  // namespace mp

int main(int argc, char** argv) {
  CLI::App app{"mp_worker: one rank of a sharded mixed-precision training job.\n"
               "Launch with: launch/mprun -np N build/mp_worker"};
  bool version = false;
  mp::WorkerOptions w;
  app.add_flag("--version", version, "Print the version and build, then exit");
  app.add_option("--steps", w.steps, "Optimizer steps")->check(CLI::Range(1, 1 << 30));
  app.add_option("--strategy", w.strategy,
                 "NO_SHARD, SHARD_OPTIMIZER, SHARD_GRAD_OP, FULL_SHARD or HYBRID_SHARD");
  app.add_option("--recipe", w.recipe, "fp32, tf32, amp_bf16, bf16_master, bf16_remainder, pure_bf16, amp_fp16");
  app.add_option("--micro-batches", w.micro_batches, "Micro-batches per rank per step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--micro-batch-size", w.micro_batch_size, "Samples per micro-batch")->check(CLI::Range(1, 1 << 20));
  app.add_option("--prefetch-depth", w.prefetch_depth, "All-gathers issued ahead")->check(CLI::Range(0, 64));
  app.add_option("--hybrid-shard-size", w.hybrid_shard_size, "HYBRID_SHARD group size");
  app.add_option("--mlp-dims", w.mlp_dims, "MLP layer widths: input, hidden..., classes")->delimiter(',');
  app.add_option("--lr", w.lr, "Peak learning rate (AdamW)");
  app.add_flag("--deterministic", w.deterministic, "World-size-independent gradient reduction");
  app.add_flag("--plan", w.plan, "Print the per-rank memory plan and exit, without running");
  auto* world_size = app.add_option("--world-size", w.plan_world_size,
                                    "With --plan: the (hypothetical) number of ranks, e.g. 1024; default: the "
                                    "mpirun world size, else 1")
                         ->check(CLI::Range(1, 1 << 24));
  app.add_flag("--plan-all", w.plan_all, "With --plan: total bytes per parameter of every strategy x recipe");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (version) {
    mp::print_version();
    return 0;
  }
  if (w.plan_all) w.plan = true;
  if (world_size->count() > 0 && !w.plan) {
    std::fprintf(stderr, "mp_worker: --world-size applies to --plan only (a run takes its size from mpirun)\n");
    return 2;
  }
  if (w.plan) {
    if (world_size->count() == 0) {
      const char* env = std::getenv("OMPI_COMM_WORLD_SIZE");
      if (env != nullptr) w.plan_world_size = std::max(1, std::atoi(env));
    }
    try {
      return mp::print_plan(w);
    } catch (const mp::ConfigError& e) {
      std::fprintf(stderr, "mp_worker: %s\n", e.what());
      return 2;
    }
  }
  return mp::run_rank_main("mp_worker", &argc, &argv, [&](const mp::MpiWorld& world) { return mp::run(world, w); });
}

// launch/mp_worker.cc: the training worker, one process per rank:
//   mpirun -np N build/mp_worker      (or launch/mprun -np N build/mp_worker)
// Exit codes: 0 success, 2 bad configuration or input, 1 runtime failure.
// Errors are printed on every rank that saw them, prefixed "[rank R]"; a
// failing rank then aborts the job so no other rank waits for it forever.
#include <dnnl.h>
#include <google/protobuf/stubs/common.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm_config.h"
#include "comm/mpi/link_check.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_world.h"
#include "comm/rank_discovery.h"
#include "core/error.h"
#include "core/stop_signals.h"
#include "launch/crash_report.h"
#include "launch/device_choice.h"
#include "launch/plan_search.h"
#include "launch/rank_info.h"
#include "launch/rank_main.h"
#include "launch/run_model.h"
#include "launch/train_config.h"
#include "launch/trainer.h"
#include "mp/config.h"
#include "runtime/checkpoint.h"
#include "runtime/engine.h"
#include "runtime/memory_plan.h"
#include "runtime/muon_plan.h"
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
            << "formats: TrainConfig text " << kTrainConfigFormatVersion << ", checkpoint "
            << kCheckpointFormatVersion << "\n"
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

// --plan: the long-lived bytes per category of one rank, without running.

int print_plan(const TrainSettings& s, int world_size, bool all) {
  const ModelSpec spec = model_spec(s);
  const char* model = s.model == ModelKind::kGpt ? "GPT" : "MLP";
  if (all) {
    std::printf("bytes per parameter per rank, %s of %lld parameters, world size %d\n%-16s", model,
                static_cast<long long>(spec.numel()), world_size, "strategy");
    for (const std::string& r : precision_recipe_names()) std::printf(" %14s", r.c_str());
    std::printf("\n");
    for (const char* name : {"NO_SHARD", "SHARD_OPTIMIZER", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD"}) {
      std::printf("%-16s", name);
      for (const std::string& r : precision_recipe_names()) {
        proto::EngineConfig e = s.config.engine();
        e.mutable_sharding()->set_strategy(parse_strategy(name));
        if (std::string(name) == "HYBRID_SHARD" && e.sharding().hybrid_shard_size() == 0) {
          e.mutable_sharding()->set_hybrid_shard_size(std::min(8, world_size));
        }
        *e.mutable_precision() = precision_recipe(r);
        std::printf(" %14.4f", plan_memory(spec, e, world_size).total_bytes_per_param());
      }
      std::printf("\n");
    }
    return 0;
  }
  MemoryPlan plan = plan_memory(spec, s.config.engine(), world_size);
  const EngineOptions o = resolve_engine_options(s.config.engine(), world_size);
  // The model's activations on the device this machine's rank 0 would
  // compute on (Note [Device choice], one rank per node).
  const DeviceChoice device = use_device(s.config.compute(), 0, 0, 1);
  plan.bytes[static_cast<size_t>(MemCategory::kActivations)] =
      static_cast<size_t>(model_activation_bytes(s, device.device));
  if (s.config.checkpoint().async_save()) plan.checkpoint_snapshot_bytes = plan_checkpoint_snapshot(spec, o);
  const std::string recompute =
      o.recompute_every == 0 ? "" : ", activations recomputed: " + recompute_name(o.recompute_every);
  std::printf("memory plan: %s of %lld parameters, %s, %s, world size %d, on %s%s\n%s", model,
              static_cast<long long>(plan.params), std::string(strategy_name(o.strategy)).c_str(), o.precision.describe().c_str(),
              world_size, to_string(device.device).c_str(), recompute.c_str(), plan.to_string().c_str());
  const Optimizer optimizer(s.config.engine().optimizer());
  if (const MuonSettings* muon = optimizer.muon(); muon != nullptr) {  // Note [Muon owners]
    const FlatLayout layout(spec, o.shard_size);
    std::printf("%s", describe_muon_owners(muon_matrices(layout, muon->hyper, o.shard_size), o.shard_size).c_str());
  }
  return 0;
}

// --plan --memory-per-rank: the configurations that fit (launch/plan_search.h).
int print_plan_search(const TrainSettings& s, int world_size, int ranks_per_host, uint64_t budget, int rows) {
  const int per_host = ranks_per_host > 0 ? ranks_per_host : world_size % 8 == 0 ? 8 : 1;
  const DeviceChoice device = use_device(s.config.compute(), 0, 0, 1);
  const PlanSearch search = search_plans(s, world_size, per_host, budget, device.device);
  std::cout << to_string(search, s, rows);
  return 0;
}

// The rank table (each rank on the device compute.device gives it, Note
// [Device choice]), and the links between hosts (each ping-pong bounded by
// the communication timeout `timeout`).
void print_ranks(const MpiWorld& world, const TrainSettings& s, std::chrono::milliseconds timeout) {
  const Device device = use_device(s.config.compute(), world.rank(), world.local_rank(), world.local_size()).device;
  auto comm = MpiCommunicator::create_world("ranks", CommOptions{});
  const auto infos = gather_rank_infos(*comm, local_rank_info(world, device));
  const LinkCheck link = check_host_links(int64_t{4} << 20, timeout);  // Note [Link check]
  if (world.rank() != 0) return;
  std::cout << build_string() << ": " << world.size() << " rank(s)\n"
            << discover_ranks(process_environment()).describe() << "\n";
  for (const auto& info : infos) {
    std::cout << "  rank " << info.rank() << ": " << info.hostname() << " pid " << info.pid() << ", local rank "
              << info.local_rank() << "/" << info.local_size() << ", " << info.device_description();
    if (!info.cuda_unavailable_reason().empty()) {
      std::cout << " [CUDA unavailable: " << info.cuda_unavailable_reason() << "]";
    }
    std::cout << "\n";
  }
  if (link.hosts.size() > 1) {
    std::cout << "links between hosts (best pair, 4 MiB ping-pong): " << link.summary() << "\n";
  }
  if (link.slow) std::cout << "warning: " << *link.slow << "\n";
  std::cout.flush();
}

// The world size a run started by mpirun/srun will have, read before MPI
// starts (--plan and config checks run without MPI; Note [Rank discovery]);
// 1 otherwise.
int launcher_world_size() {
  const Ranks ranks = discover_ranks(process_environment());
  return ranks.size > 0 ? ranks.size : 1;
}

// mp_worker's command line.
struct WorkerArgs {
  bool version = false, plan = false, plan_all = false, print_config = false;
  std::string config_path, out, resume, export_dir, verify_dir;
  std::vector<std::string> sets;
  int64_t steps = -1;  // -1: not given
  int plan_world_size = 0;
  int ranks_per_host = 0;             // --plan --memory-per-rank: HYBRID_SHARD's group; 0: 8 where it divides
  uint64_t memory_per_rank = 0;       // --plan --memory-per-rank: the budget; 0: not given
  int plan_rows = 25;                 // --plan-rows
  CLI::Option* world_size = nullptr;  // given: --world-size was
};

void add_options(CLI::App& app, WorkerArgs& a) {
  app.add_flag("--version", a.version, "Print the version and build, then exit");
  app.add_option("config", a.config_path, "Text-format TrainConfig (configs/*.textproto); default: the embedded one");
  app.add_option("--set", a.sets, "Override one field, e.g. --set engine.optimizer.lr=3e-4 (repeatable, in order)")
      ->allow_extra_args(false);
  app.add_option("--steps", a.steps,
                 "Optimizer steps (same as --set steps=N); 0 with --export-safetensors: no training, export the "
                 "initial (or --resume'd) weights")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--out", a.out, "Run directory: metrics.jsonl, config.textproto, TensorBoard events (--set out_dir=DIR)");
  app.add_option("--resume", a.resume,
                 "Resume from a checkpoint directory, a checkpoint root (its `latest`), or 'auto' (the latest under "
                 "checkpoint.dir if any) (--set checkpoint.resume=...)");
  app.add_option("--export-safetensors", a.export_dir,
                 "After training, write the GPT as a Hugging Face GPT-2 directory (model.safetensors + config.json)");
  app.add_option("--verify-checkpoint", a.verify_dir,
                 "Check a checkpoint (or a root's latest): manifest, file sizes, every checksum; then exit");
  app.add_flag("--print-config", a.print_config, "Print the resolved config in text format and exit");
  app.add_flag("--plan", a.plan, "Print the per-rank memory plan and exit, without running");
  a.world_size = app.add_option("--world-size", a.plan_world_size,
                                "With --plan: the (hypothetical) number of ranks, e.g. 1024; default: the "
                                "launcher's world size, else 1")
                     ->check(CLI::Range(1, 1 << 24));
  app.add_flag("--plan-all", a.plan_all, "With --plan: total bytes per parameter of every strategy x recipe");
  app.add_option("--memory-per-rank", a.memory_per_rank,
                 "With --plan: list the configurations (strategy x recipe x recomputation x micro-batches) whose "
                 "bytes per rank fit this budget, e.g. 16GiB, and the one to choose")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--ranks-per-host", a.ranks_per_host,
                 "With --memory-per-rank: ranks per host, HYBRID_SHARD's group (default: 8 where it divides the "
                 "world size)")
      ->check(CLI::PositiveNumber);
  app.add_option("--plan-rows", a.plan_rows, "With --memory-per-rank: rows shown (and the chosen one); 0: all")
      ->check(CLI::NonNegativeNumber);
}

// --verify-checkpoint: the exit code.
int verify_checkpoint_dir(const std::string& path) {
  try {
    const std::string dir = resolve_checkpoint(path);
    const int64_t bytes = verify_checkpoint(dir);
    const proto::CheckpointManifest m = read_checkpoint_manifest(dir);
    std::printf("%s: step %lld, saved by %d rank(s), %lld bytes in %d files, every checksum matches\n", dir.c_str(),
                static_cast<long long>(m.step()), m.world_size(), static_cast<long long>(bytes), m.files_size());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "mp_worker: %s\n", e.what());
    return 2;
  }
}

// The config of the command line, checked for `check_size` ranks, into
// `settings`. Returns the exit code when the worker is done without
// training (--print-config, --plan, a bad config), else nothing.
std::optional<int> resolve_settings(const WorkerArgs& a, int check_size, TrainSettings& settings) {
  try {
    proto::TrainConfig config = a.config_path.empty() ? default_train_config() : load_train_config(a.config_path);
    for (const std::string& assignment : a.sets) apply_override(config, assignment);
    if (a.steps > 0) config.set_steps(a.steps);
    if (a.steps == 0 && a.export_dir.empty()) {
      MP_THROW(ConfigError, "--steps 0 trains nothing: add --export-safetensors DIR to write the initial weights "
                            "(or, with --resume, a checkpoint's)");
    }
    if (!a.out.empty()) config.set_out_dir(a.out);
    if (!a.resume.empty()) config.mutable_checkpoint()->set_resume(a.resume);
    if (!a.export_dir.empty()) config.mutable_checkpoint()->set_export_safetensors(a.export_dir);
    settings = resolve_train_config(config, check_size);
    settings.export_only = a.steps == 0;
    if (a.print_config) {
      std::cout << to_text(settings.config);
      return 0;
    }
    if (a.plan && a.memory_per_rank > 0) {
      return print_plan_search(settings, check_size, a.ranks_per_host, a.memory_per_rank, a.plan_rows);
    }
    if (a.plan) return print_plan(settings, check_size, a.plan_all);
  } catch (const Error& e) {
    std::fprintf(stderr, "mp_worker: %s\n", e.what());
    return 2;
  }
  return std::nullopt;
}

}  // namespace
}  // namespace mp

int main(int argc, char** argv) {
  // Before MPI or any thread starts: Note [Signals and oneDNN].
  mp::install_stop_signal_watcher();
  CLI::App app{"mp_worker: one rank of a sharded mixed-precision training job.\n"
               "  build/mp_worker [CONFIG.textproto] [--set field.path=value]... [--steps N] [--out DIR] [--resume auto]\n"
               "Without CONFIG it trains the embedded default (configs/default.textproto): a small GPT on a\n"
               "synthetic language whose entropy floor is known. Launch N ranks with launch/mprun -np N, or\n"
               "launch/mp_node on one node; a bare build/mp_worker runs as world size 1."};
  mp::WorkerArgs args;
  mp::add_options(app, args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (args.version) {
    mp::print_version();
    return 0;
  }
  if (!args.verify_dir.empty()) return mp::verify_checkpoint_dir(args.verify_dir);
  if (args.plan_all) args.plan = true;
  const bool world_size_given = args.world_size->count() > 0;
  if (world_size_given && !args.plan) {
    std::fprintf(stderr, "mp_worker: --world-size applies to --plan only (a run takes its size from the launcher)\n");
    return 2;
  }
  const int check_size = world_size_given ? args.plan_world_size : mp::launcher_world_size();
  // The config is read and checked before MPI starts: a bad file or field
  // ends every rank at once with exit code 2 and the same message.
  mp::TrainSettings settings;
  if (const std::optional<int> code = mp::resolve_settings(args, check_size, settings)) return *code;
  mp::install_worker_crash_report(settings.config.out_dir(), mp::discover_ranks(mp::process_environment()).rank);
  return mp::run_rank_main("mp_worker", &argc, &argv, [&](const mp::MpiWorld& world) {
    mp::print_ranks(world, settings, mp::comm_options_from_config(settings.config.engine().comm()).timeout);
    return mp::train(world, world.size() == check_size ? settings : mp::resolve_train_config(settings.config, world.size()));
  });
}

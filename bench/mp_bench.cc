// bench/mp_bench.cc: the benchmark driver, one process per rank:
//   launch/mprun -np 2 build/mp_bench comm [--sizes 64K,16M] [--iters N] [--warmup N] [--json-only]
// Each measurement is one JSON line on rank 0's stdout (bench/bench.h).
// Exit codes: 0 success, 2 bad suite, flag or option value, 1 runtime
// failure (a wrong collective result included). Errors go to stderr
// prefixed "[rank R]"; a failing rank then aborts the job so no other rank
// waits for it forever.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/suites.h"
#include "comm/mpi/mpi_world.h"
#include "core/error.h"
#include "launch/rank_main.h"
#include "mp/config.h"

namespace mp::bench {
namespace {

struct Suite {
  const char* name;
  void (*run)(const BenchContext&);
  const char* what;
};

constexpr Suite kSuites[] = {
    {"comm", run_comm_suite, "MpiCommunicator collectives vs raw MPI (run with -np 2 or more)"},
    {"comm_gloo", run_comm_gloo_suite, "GlooCommunicator collectives vs MpiCommunicator (run with -np 2 or more)"},
    {"reduce_accuracy", run_reduce_accuracy_suite,
     "bf16 reductions: kWire vs kFp32 error against the exact sum, at this world size and simulated rings"},
    {"update", run_update_suite, "the fused AdamW step vs a STREAM triad, 1 and 2 threads (run with -np 1)"},
#if MP_WITH_CUDA
    {"update_cuda", run_update_cuda_suite, "the fused AdamW step on the GPU vs a device-to-device copy (run with -np 1)"},
    {"gemm_cuda", run_gemm_cuda_suite,
     "GPT-2 124M's GEMMs on the GPU as the model runs them vs a plain fp32 product and the 8192^3 bf16 peak "
     "(--sizes: the batches, default 4,16; run with -np 1)"},
#endif
    {"step", run_step_suite, "engine step phases, prefetch on/off vs serialized communication (run with -np 2)"},
    {"gemm", run_gemm_suite, "gemm_cpu GFLOP/s on the GPT-2 124M shapes vs the 2048^3 peak (run with -np 1)"},
    {"gpt", run_gpt_suite,
     "GPT-2 124M and a small GPT through the engine: tokens/s, model FLOP/s vs the GEMM peak (--bind-to none)"},
    {"muon", run_muon_suite,
     "optimizer kind MUON on GPT-2 124M and a small GPT: the time it adds to a step vs its Newton-Schulz FLOPs over "
     "the GEMM peak (--bind-to none)"},
    {"ckpt", run_ckpt_suite,
     "checkpoint save/load GB/s of GPT-2 124M vs plain write+fsync/read of the same bytes (run with -np 2)"},
    {"ckpt_async", run_ckpt_async_suite,
     "training time of GPT-2 124M with a save every 10 steps: asynchronous vs synchronous vs none (run with -np 2)"},
    {"recipes", run_recipes_suite, "the default GPT under every precision recipe and strategy (run with -np 2)"},
};

const Suite* find_suite(const std::string& name) {
  for (const Suite& s : kSuites) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

std::string suite_list() {
  std::string out;
  for (const Suite& s : kSuites) out += detail::str("\n  ", s.name, ": ", s.what);
  return out;
}

}  // namespace
}  // namespace mp::bench

int main(int argc, char** argv) {
  namespace b = mp::bench;
  CLI::App app{"mp_bench: benchmarks that print one JSON line per measurement, each against a "
               "reference measured in the same run.\n"
               "Launch with: launch/mprun -np 2 build/mp_bench SUITE [options]\nSuites:" +
               b::suite_list()};
  std::string suite_name;
  std::vector<std::string> sizes;
  b::BenchOptions options;
  app.add_option("suite", suite_name, "The suite to run")->required();
  app.add_option("--sizes", sizes,
                 "Sizes to sweep, in bytes, with optional K, M or G (binary): 64K,16M or 65536 "
                 "(default: the suite's sweep)")
      ->delimiter(',');
  app.add_option("--iters", options.iters, "Timed iterations per contender")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--warmup", options.warmup, "Untimed iterations per contender first")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_flag("--json-only", options.json_only, "Print only the JSON lines (no '# ' notes)");
  app.add_option("--model", options.model, "ckpt: gpt2 (GPT-2 124M) or small (the default 0.83M GPT)")
      ->check(CLI::IsMember({"gpt2", "small"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const b::Suite* suite = b::find_suite(suite_name);
  if (suite == nullptr) {
    std::cerr << "mp_bench: unknown suite '" << suite_name << "'; suites:" << b::suite_list() << std::endl;
    return 2;
  }
  try {
    for (const std::string& s : sizes) options.sizes_bytes.push_back(b::parse_size_bytes(s));
  } catch (const mp::Error& e) {
    std::cerr << "mp_bench: " << e.message() << std::endl;
    return 2;
  }

  return mp::run_rank_main("mp_bench", &argc, &argv, [&](const mp::MpiWorld& world) {
    const b::Reporter reporter(suite->name, world.rank(), options.json_only);
    suite->run(b::BenchContext{world, options, reporter});
    return 0;
  });
}

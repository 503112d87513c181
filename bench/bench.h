// bench/bench.h: what every mp_bench suite shares: the options, the context a
// suite runs in, and the reporter that writes one JSON line per measurement.
//
// Output contract (docs/architecture.md "Contracts"): each measurement is
// one JSON object on one line of stdout, printed by rank 0 only:
//   {"suite": "comm", "case": "reduce_scatter_fp32_16M", "value": 1.23,
//    "unit": "ms", "ref": "mpi_reduce_scatter_block", "ref_value": 1.20,
//    "ratio": 1.025, "better": "lower", ...}
// ratio = value / ref_value; "better" says which direction of value and ratio
// is better. Without --json-only rank 0 also prints human-readable lines,
// each starting with "# ", on stdout. Other ranks print nothing on success.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi/mpi_world.h"

namespace mp::bench {

struct BenchOptions {
  // Sizes to sweep, in bytes; empty means the suite's default sweep. What a
  // size measures is the suite's to say (comm: the per-rank fp32 input).
  std::vector<int64_t> sizes_bytes;
  int iters = 20;   // timed iterations per contender
  int warmup = 3;   // untimed iterations per contender first
  bool json_only = false;
  // ckpt: "gpt2" (GPT-2 124M, default) or "small" (the default 0.83M GPT,
  // for smoke tests).
  std::string model = "gpt2";
};

// "65536", "64K", "64KiB", "16M", "1G" (binary multiples) -> bytes. Throws
// ConfigError on anything else or a non-positive size.
int64_t parse_size_bytes(const std::string& text);
// 65536 -> "64K", 16 << 20 -> "16M", 1000 -> "1000B": the suffix of case names.
std::string size_label(int64_t bytes);

// Prints on rank 0 only.
class Reporter {
 public:
  Reporter(std::string suite, int rank, bool json_only)
      : suite_(std::move(suite)), rank_(rank), json_only_(json_only) {}

  const std::string& suite() const { return suite_; }
  // One measurement; "suite" is put first. Flushed at once.
  void emit(const nlohmann::ordered_json& fields) const;
  // A human-readable line ("# " + text), unless --json-only.
  void note(const std::string& text) const;

 private:
  std::string suite_;
  int rank_;
  bool json_only_;
};

struct BenchContext {
  const MpiWorld& world;
  const BenchOptions& options;
  const Reporter& reporter;
};

// A Gloo world (comm/gloo/) over the job's ranks, meeting through a file
// store in a directory rank 0 makes and tells the others over MPI.
// Collective.
std::unique_ptr<Communicator> gloo_bench_world(const std::string& name);
// The world a suite trains over: MPI's, or Gloo's with
// MP_BENCH_DATA_PLANE=gloo (the gpt suite: GPT-2's step on either).
std::unique_ptr<Communicator> bench_world(const std::string& name);

// Rounds to `digits` decimals so the JSON stays readable (1.2345, not
// 1.2345000000000002: the library prints the shortest round-trip form).
double round_to(double v, int digits);

}  // namespace mp::bench

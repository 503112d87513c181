// bench/ckpt_async_bench.cc: suite "ckpt_async": what checkpoints cost a
// training run, synchronous saves (save_checkpoint) against asynchronous
// ones (CheckpointWriter, Note [Asynchronous saves] in runtime/checkpoint.h)
// against none, measured in the same run.
//
// GPT-2 124M as configs/gpt2_124m.textproto trains it (SHARD_OPTIMIZER,
// amp_bf16: bf16 GEMMs, fp32 master and moments, 12 bytes per parameter in
// the checkpoint), T = 64 (context 64, as the gpt suite), one micro-batch of
// --sizes B (default 2) sequences per rank, over the job's ranks. Training
// runs in blocks of 10 steps, one save per block as with
// checkpoint.interval_steps = 10, saved after the block's first step so that
// an asynchronous write ends inside its own block:
// - none:  10 steps;
// - sync:  save_checkpoint after step 1, 10 steps in all;
// - async: save_async after step 1, then after every step the ranks agree
//          whether every write has ended and commit if so (what mp_worker
//          does); the block ends with wait(), so a commit never leaks into
//          the next block.
// Every block makes the same one-number agreement after each step. The
// modes take turns, block by block (the order rotating each round), so a
// load that comes and goes on a shared host touches each alike; --iters
// rounds (default 3) after one untimed round. A block's time is rank 0's,
// from a barrier to its end. A mode's cost in a round is its block's time
// over the same round's block without saves, less 1; the cost is the median
// over rounds (pairing within a round takes out most of a load that comes
// and goes). The same from the CPU time of the ranks (getrusage, all
// threads, summed over ranks), which other processes on the host barely
// touch. value = the async cost in % of the training time, ref = the sync
// cost.
// MP_BENCH_CKPT_DIR picks the file system; default the system temporary
// directory.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "bench/suites.h"
#include "bench/timing.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "models/gpt.h"
#include "runtime/checkpoint.h"
#include "runtime/engine.h"
#include "runtime/precision.h"

namespace mp::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kBlockSteps = 10;
enum class Mode { kNone, kSync, kAsync };
constexpr Mode kModes[] = {Mode::kNone, Mode::kSync, Mode::kAsync};
const char* mode_name(Mode m) { return m == Mode::kNone ? "none" : m == Mode::kSync ? "sync" : "async"; }

struct BlockStats {
  double seconds = 0;        // the block, rank 0
  double cpu_seconds = 0;    // the block's CPU time, every thread of every rank
  double save_s = 0;         // sync: the save; async: the snapshot (the training thread's part)
  double write_s = 0;        // async: rank 0's background write
  double commit_steps = 0;   // async: the block's step after which it committed (11: at the block's end)
  double commit_s = 0;       // async: the commit
  double slowest_step_s = 0; // the slowest step of the block (the save not included)
  int slowest_step = 0;
};

// This process's CPU time, every thread.
double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

}  // namespace

void run_ckpt_async_suite(const BenchContext& ctx) {
  const MpiWorld& mpi = ctx.world;
  auto world = MpiCommunicator::create_world("ckpt_async_bench", CommOptions{});
  const char* env_dir = std::getenv("MP_BENCH_CKPT_DIR");
  const std::string base = env_dir != nullptr && *env_dir != '\0' ? env_dir : fs::temp_directory_path().string();
  long pid = static_cast<long>(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  const std::string root = base + "/mp_ckpt_async_bench_" + std::to_string(pid);

  GptConfig g;  // GPT-2 124M at T = 64
  g.vocab = 50257;
  g.context = 64;
  g.channels = 768;
  g.heads = 12;
  g.layers = 12;
  g.micro_batch_size = ctx.options.sizes_bytes.empty() ? 2 : ctx.options.sizes_bytes.front();
  g.threads = std::max(1, default_cpu_threads() / std::max(1, mpi.local_size()));
  g.matmul_dtype = DType::kBF16;
  proto::EngineConfig config;
  config.mutable_sharding()->set_strategy(proto::ShardingConfig::SHARD_OPTIMIZER);
  *config.mutable_precision() = precision_recipe("amp_bf16");
  config.set_micro_batches(1);
  config.set_seed(42);
  Allocator allocator;
  Gpt model(g, allocator);
  Engine engine(model.spec(), config, *world, allocator);
  CheckpointSaveOptions save_options;
  save_options.keep_last = 1;
  CheckpointWriter writer(engine, root + "/async", save_options);
  const int rounds = ctx.options.iters == BenchOptions{}.iters ? 3 : ctx.options.iters;
  ctx.reporter.note(detail::str("GPT-2 124M (", model.spec().numel(), " parameters, T 64), SHARD_OPTIMIZER amp_bf16 on ",
                                world->size(), " rank(s) x ", g.threads, " thread(s), ", g.micro_batch_size,
                                " sequence(s) per rank per step; blocks of ", kBlockSteps,
                                " steps with one save each; files under ", root, "; median of ", rounds,
                                " rounds after 1 untimed"));

  auto block = [&](Mode mode) {
    BlockStats st;
    std::optional<int> committed_after;
    MPI_Barrier(MPI_COMM_WORLD);
    const double cpu0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    for (int i = 0; i < kBlockSteps; ++i) {
      const auto s0 = Clock::now();
      engine.step(model);
      const double step_s = std::chrono::duration<double>(Clock::now() - s0).count();
      if (step_s > st.slowest_step_s) {
        st.slowest_step_s = step_s;
        st.slowest_step = i + 1;
      }
      // The step agreement mp_worker makes (one small collective), in every mode.
      const bool all_written = world->all_reduce_int64(writer.written() ? 1 : 0, HostOp::kMin) == 1;
      if (mode == Mode::kAsync && writer.pending() && all_written) {
        const auto c0 = Clock::now();
        st.write_s = writer.wait()->write_seconds;
        st.commit_s = std::chrono::duration<double>(Clock::now() - c0).count();
        committed_after = i + 1;
      }
      if (i != 0) continue;
      const auto v0 = Clock::now();
      if (mode == Mode::kSync) save_checkpoint(engine, root + "/sync", save_options);
      if (mode == Mode::kAsync) writer.save_async();
      st.save_s = std::chrono::duration<double>(Clock::now() - v0).count();
    }
    if (mode == Mode::kAsync) {
      if (const std::optional<CheckpointInfo> info = writer.wait()) {
        st.write_s = info->write_seconds;
        committed_after = kBlockSteps + 1;  // not within the block's steps
      }
    }
    st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const double cpu = process_cpu_seconds() - cpu0;
    MPI_Allreduce(&cpu, &st.cpu_seconds, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    st.commit_steps = committed_after.value_or(0);
    MPI_Bcast(&st.seconds, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return st;
  };

  std::vector<std::vector<BlockStats>> stats(3);
  for (int r = 0; r <= rounds; ++r) {
    for (int k = 0; k < 3; ++k) {
      const Mode m = kModes[(k + r) % 3];
      const BlockStats st = block(m);
      if (r > 0) stats[static_cast<size_t>(m)].push_back(st);
      ctx.reporter.note(detail::str(r == 0 ? "untimed " : "round ", r, " ", mode_name(m), ": ", round_to(st.seconds, 3),
                                    " s", m == Mode::kNone ? "" : detail::str("; save call ", round_to(st.save_s, 3), " s"),
                                    m == Mode::kAsync ? detail::str("; background write ", round_to(st.write_s, 3),
                                                                    " s, committed after step ", st.commit_steps, " in ",
                                                                    round_to(st.commit_s, 3), " s")
                                                      : "",
                                    "; slowest step ", st.slowest_step, ": ", round_to(st.slowest_step_s, 3), " s"));
    }
  }
  auto med = [&](Mode m, double BlockStats::*field) {
    std::vector<double> v;
    for (const BlockStats& s : stats[static_cast<size_t>(m)]) v.push_back(s.*field);
    return median(v);
  };
  // Mode m's cost: the median over rounds of its block over the round's block without saves, less 1.
  auto cost = [&](Mode m, double BlockStats::*field) {
    std::vector<double> v;
    for (size_t r = 0; r < stats[0].size(); ++r) {
      v.push_back(stats[static_cast<size_t>(m)][r].*field / stats[0][r].*field - 1);
    }
    return median(v);
  };
  const double none = med(Mode::kNone, &BlockStats::seconds), sync = med(Mode::kSync, &BlockStats::seconds);
  const double async = med(Mode::kAsync, &BlockStats::seconds);
  const double sync_cost = cost(Mode::kSync, &BlockStats::seconds), async_cost = cost(Mode::kAsync, &BlockStats::seconds);
  const double sync_cpu = cost(Mode::kSync, &BlockStats::cpu_seconds);
  const double async_cpu = cost(Mode::kAsync, &BlockStats::cpu_seconds);
  ctx.reporter.emit({{"case", "gpt2_124m_every_10_steps"},
                     {"value", round_to(100 * async_cost, 2)},
                     {"unit", "% of training time (async saves)"},
                     {"ref", "sync_saves"},
                     {"ref_value", round_to(100 * sync_cost, 2)},
                     {"ratio", round_to(sync_cost > 0 ? async_cost / sync_cost : 0, 3)},
                     {"better", "lower"},
                     {"cpu_time_cost_pct_async", round_to(100 * async_cpu, 2)},
                     {"cpu_time_cost_pct_sync", round_to(100 * sync_cpu, 2)},
                     {"block_s_none", round_to(none, 3)},
                     {"block_s_sync", round_to(sync, 3)},
                     {"block_s_async", round_to(async, 3)},
                     {"sync_save_s", round_to(med(Mode::kSync, &BlockStats::save_s), 3)},
                     {"async_snapshot_s", round_to(med(Mode::kAsync, &BlockStats::save_s), 3)},
                     {"async_write_s", round_to(med(Mode::kAsync, &BlockStats::write_s), 3)},
                     {"snapshot_bytes_rank0", writer.snapshot_bytes()},
                     {"ranks", world->size()},
                     {"rounds", rounds}});
  ctx.reporter.note(detail::str("10 steps (medians): ", round_to(none, 3), " s without saves, ", round_to(sync, 3),
                                " s with a synchronous save, ", round_to(async, 3),
                                " s with an asynchronous one; cost (median over rounds, against the same round): sync ",
                                round_to(100 * sync_cost, 1), "%, async ", round_to(100 * async_cost, 1),
                                "% (target <= 5%), async / sync ", round_to(sync_cost > 0 ? async_cost / sync_cost : 0, 3),
                                "; in CPU time: sync ", round_to(100 * sync_cpu, 1), "%, async ",
                                round_to(100 * async_cpu, 1), "%"));
  MPI_Barrier(MPI_COMM_WORLD);
  if (mpi.rank() == 0) fs::remove_all(root);
}

}  // namespace mp::bench

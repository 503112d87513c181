// bench/ckpt_bench.cc: checkpoint save and load throughput against a plain
// sequential write and read of the same bytes, measured in the same run.
//
// The model is GPT-2 124M (--model small: the default 0.83M GPT; only its
// parameter layout: no compute runs),
// FULL_SHARD over the job's ranks, with the recipes that store the most and
// the least (bf16_master: fp32 master, bf16 params, two fp32 moments, 14
// bytes per parameter; pure_bf16: bf16 params and moments, 6). Per
// iteration, every rank at once:
// - save: save_checkpoint (each rank writes its shard file with per-block
//   CRC32C and fsyncs; rank 0 writes the manifest, renames, moves `latest`);
// - write ref: each rank writes the same number of bytes to one file with
//   write() in 64 MiB pieces and fsyncs;
// - load: load_checkpoint into a fresh engine state (reads every block it
//   needs, checks each CRC, fills the shard);
// - read ref: each rank reads its reference file back with read().
// A time is the slowest rank's; throughput = all ranks' bytes / time; the
// median over iterations. Both reads come from the page cache when the
// file fits (as they do after a save on a machine with memory to spare):
// the ratio is what matters. --dir (env MP_BENCH_CKPT_DIR) picks the file
// system; default the system temporary directory.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/suites.h"
#include "bench/timing.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "models/gpt.h"
#include "runtime/checkpoint.h"
#include "runtime/engine.h"
#include "runtime/precision.h"

namespace mp::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Seconds of `f` on the slowest rank, all ranks starting together.
template <class F>
double timed(F f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  f();
  double mine = std::chrono::duration<double>(Clock::now() - t0).count(), slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

void plain_write(const std::string& path, const std::vector<char>& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MP_ENFORCE(fd >= 0, "cannot create ", path);
  constexpr size_t kPiece = size_t{64} << 20;
  for (size_t at = 0; at < data.size(); at += kPiece) {
    const size_t n = std::min(kPiece, data.size() - at);
    MP_ENFORCE(::write(fd, data.data() + at, n) == static_cast<ssize_t>(n), "write to ", path);
  }
  MP_ENFORCE(::fsync(fd) == 0, "fsync ", path);
  ::close(fd);
}

void plain_read(const std::string& path, std::vector<char>& data) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MP_ENFORCE(fd >= 0, "cannot open ", path);
  size_t at = 0;
  while (at < data.size()) {
    const ssize_t n = ::read(fd, data.data() + at, data.size() - at);
    MP_ENFORCE(n > 0, "read ", path);
    at += static_cast<size_t>(n);
  }
  ::close(fd);
}

}  // namespace

void run_ckpt_suite(const BenchContext& ctx) {
  const MpiWorld& world = ctx.world;
  const char* env_dir = std::getenv("MP_BENCH_CKPT_DIR");
  std::string base = env_dir != nullptr && *env_dir != '\0' ? env_dir : fs::temp_directory_path().string();
  long pid = static_cast<long>(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  const std::string root = base + "/mp_ckpt_bench_" + std::to_string(pid);
  const std::string ref_path = root + "/ref_" + std::to_string(world.rank()) + ".bin";
  if (world.rank() == 0) fs::create_directories(root);
  MPI_Barrier(MPI_COMM_WORLD);

  GptConfig g;  // GPT-2 124M, or the default small GPT (--model small)
  const bool small = ctx.options.model == "small";
  g.vocab = small ? 256 : 50257;
  g.context = small ? 64 : 1024;
  g.channels = small ? 128 : 768;
  g.heads = small ? 4 : 12;
  g.layers = small ? 4 : 12;
  const std::string model_name = small ? "small_gpt" : "gpt2_124m";
  const ModelSpec spec = Gpt::spec_for(g);
  auto comm = MpiCommunicator::create_world("ckpt_bench", CommOptions{});
  const int iters = std::max(1, std::min(ctx.options.iters, 5));
  ctx.reporter.note(detail::str(small ? "the small GPT" : "GPT-2 124M", " (", spec.numel(), " parameters), FULL_SHARD on ", world.size(),
                                " rank(s), files under ", root, "; CRC32C ",
                                crc32c_hardware() ? "SSE4.2" : "table", "; median of ", iters));
  for (const std::string recipe : {"bf16_master", "pure_bf16"}) {
    proto::EngineConfig config;
    config.mutable_sharding()->set_strategy(proto::ShardingConfig::FULL_SHARD);
    *config.mutable_precision() = precision_recipe(recipe);
    config.set_seed(1);
    Engine engine(spec, config, *comm);
    std::vector<double> save_s, load_s, write_s, read_s;
    int64_t bytes = 0;
    for (int i = 0; i < iters; ++i) {
      if (world.rank() == 0) {
        fs::remove_all(root + "/ckpt");
        fs::remove(ref_path);
      }
      CheckpointInfo saved;
      save_s.push_back(timed([&] { saved = save_checkpoint(engine, root + "/ckpt"); }));
      bytes = saved.bytes;  // every shard file: the ranks' total
      const auto per_rank = static_cast<size_t>(bytes / world.size());
      std::vector<char> data(per_rank, 1);
      write_s.push_back(timed([&] { plain_write(ref_path, data); }));
      load_s.push_back(timed([&] { load_checkpoint(engine, resolve_checkpoint(root + "/ckpt")); }));
      read_s.push_back(timed([&] { plain_read(ref_path, data); }));
      fs::remove(ref_path);
    }
    const double gb = static_cast<double>(bytes) / 1e9;
    const double save_gbps = gb / median(save_s), write_gbps = gb / median(write_s);
    const double load_gbps = gb / median(load_s), read_gbps = gb / median(read_s);
    const double per_param = static_cast<double>(bytes) / static_cast<double>(spec.numel());
    ctx.reporter.emit({{"case", "save_" + model_name + "_" + recipe},
                       {"value", round_to(save_gbps, 3)},
                       {"unit", "GB/s"},
                       {"ref", "write_fsync_same_bytes"},
                       {"ref_value", round_to(write_gbps, 3)},
                       {"ratio", round_to(save_gbps / write_gbps, 3)},
                       {"better", "higher"},
                       {"bytes", bytes},
                       {"bytes_per_param", round_to(per_param, 3)},
                       {"save_s", round_to(median(save_s), 4)},
                       {"ranks", world.size()}});
    ctx.reporter.emit({{"case", "load_" + model_name + "_" + recipe},
                       {"value", round_to(load_gbps, 3)},
                       {"unit", "GB/s"},
                       {"ref", "read_same_bytes"},
                       {"ref_value", round_to(read_gbps, 3)},
                       {"ratio", round_to(load_gbps / read_gbps, 3)},
                       {"better", "higher"},
                       {"bytes", bytes},
                       {"load_s", round_to(median(load_s), 4)},
                       {"ranks", world.size()}});
    ctx.reporter.note(detail::str(recipe, ": ", gb, " GB (", per_param, " bytes/param): save ", save_gbps,
                                  " GB/s vs plain write+fsync ", write_gbps, " (", save_gbps / write_gbps,
                                  "); load ", load_gbps, " GB/s vs plain read ", read_gbps, " (",
                                  load_gbps / read_gbps, ")"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world.rank() == 0) fs::remove_all(root);
}

}  // namespace mp::bench

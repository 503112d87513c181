// runtime/checkpoint.h: sharded, atomic checkpoints of the engine's state
// that load at any world size and strategy.
//
// Note [Checkpoint format]
// A checkpoint is a directory ROOT/step_00000100/ with
// - manifest.pb: a 32-byte header (magic "MPCKMANI", u32 format version,
//   u32 CRC32C of the payload, u64 payload bytes, u64 reserved) and a
//   binary proto::CheckpointManifest: world size, strategy, precision, every
//   unit's parameters (name, shape, flat offset) and fields, the optimizer
//   and loss-scaler state, the seed (stochastic rounding and init are
//   Philox(seed, step, index), so the step is the RNG state), the data
//   position (the step) and the run's config;
// - shard_RRRRR.bin, one per rank, written in parallel: a 64-byte header
//   and chunks, each one field (master, param, remainder, state0, state1)
//   over a global element range of one unit's flat buffer. The manifest
//   lists every chunk and a CRC32C per 1 MiB block of every file.
// Replicas split their shard: rank j of R replicas writes the j-th part,
// so every element is written once and every rank writes (NO_SHARD too).
//
// Note [Atomic saves]
// Ranks write into ROOT/.tmp-step_N/ and fsync; then rank 0 writes the
// manifest, fsyncs, renames the directory to ROOT/step_N, fsyncs ROOT, and
// only then replaces ROOT/latest (write latest.tmp, fsync, rename). A crash
// at any point leaves `latest` naming a complete checkpoint. Older
// checkpoints beyond keep_last and stale .tmp-* directories are removed
// after `latest` moved.
//
// Note [Asynchronous saves]
// CheckpointWriter::save_async splits a save in two. On the training thread,
// at a step boundary: rank 0 prepares ROOT/.tmp-step_N/ (agreed), and every
// rank copies the chunks it writes (its part of master, param, remainder,
// state0, state1) into a host snapshot, pinned for the engine's device
// (core/pinned.h), allocated at the first save and reused. The snapshot is
// the image of the rank's shard file: the header and each chunk at its file
// offset, so nothing is copied again. The manifest's step-dependent part
// (optimizer counters, loss scaler, config) is taken at the same moment.
// Training then goes on while one background thread per rank computes the
// blocks' CRC32C, writes the image (the same bytes a synchronous save
// writes) and fsyncs it. That thread touches only the snapshot and its own
// file: no engine state, no communicator, so no collective ever runs beside
// the training thread's.
// The commit is collective and runs on the training thread: the ranks agree
// that every write succeeded (a failed write throws on every rank, naming
// the file, and `latest` stays where it was), gather the file descriptions,
// and rank 0 publishes as in Note [Atomic saves] (manifest, rename,
// `latest`). It happens in wait(), at the next save_async (at most one
// write is in flight: the next save first commits the previous one), or
// wherever the caller finds every rank's written() true: mp_worker adds
// written() to the agreement it makes after every step (Note [Step
// agreement] in launch/trainer.h) and commits at the first step boundary
// where all ranks are done. So a crash (SIGKILL) during a background write
// leaves `latest` naming the previous complete checkpoint, and the commit
// always precedes the next prepare. Removing the checkpoints beyond
// keep_last and stale .tmp-* directories (rank 0, after `latest` moved)
// runs on a thread of its own, joined before the next prepare, so it never
// removes a write in flight. The destructor waits for a write in flight but
// does not commit (it is not collective): an uncommitted save stays a .tmp-
// directory, removed after the next commit.
// The writer thread runs at a lower CPU priority (nice +10) so that on a
// busy host the training threads keep the cores, and writes with O_DIRECT
// where the file system allows (write_checkpoint_image): a buffered write
// and its writeback cost the kernel far more CPU time than the copy itself,
// time a background write would take from training.
//
// Note [Resharding]
// Flat offsets do not depend on the world size (models/flat_layout.h), so
// a rank of any new world size and strategy needs, per unit and field, the
// global range [offset, offset + shard_numel) of its new shard. It reads
// exactly the chunks that intersect it, the 1 MiB blocks that hold those
// bytes, and checks each block's CRC. Padding the old run did not have is
// zero. No conversion step, no full copy on any rank.
//
// Every read is checked: a missing or truncated file, a wrong magic or
// version, a checksum mismatch, chunks outside their file or unit,
// elements no file holds, a parameter whose name, shape or offset differs
// from the model, a precision policy that keeps other fields: each throws
// ConfigError (IoError for a file that cannot be opened) naming the file
// and what is wrong, on every rank (the ranks agree before anyone throws).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "core/pinned.h"
#include "formats/checkpoint_format.h"
#include "proto/mp.pb.h"
#include "runtime/engine.h"

namespace mp {

struct CheckpointSaveOptions {
  int keep_last = 3;        // complete checkpoints kept under the root (>= 1)
  std::string config_text;  // stored in the manifest (mp_worker: the TrainConfig)
};

struct CheckpointInfo {
  std::string path;         // the checkpoint directory
  int64_t step = 0;
  int64_t bytes = 0;        // all shard files and the manifest
  double seconds = 0;       // wall time of the save or load on this rank (async: the snapshot)
  double write_seconds = 0; // async: this rank's background write, fsync included
};

// Saves the engine's state as ROOT/step_<steps run>. Collective over the
// engine's world; call between steps. If that directory already exists
// and `latest` names it, nothing is written (the state of a step is saved
// once). Throws IoError on every rank if any rank failed; the previous
// checkpoint stays valid. CheckpointWriter saves in the background.
CheckpointInfo save_checkpoint(Engine& engine, const std::string& root, const CheckpointSaveOptions& options = {});

// Asynchronous saves (Note [Asynchronous saves]) of one engine under one
// root. Not thread-safe: call from the training thread only.
class CheckpointWriter {
 public:
  // `engine` must outlive the writer.
  CheckpointWriter(Engine& engine, std::string root, CheckpointSaveOptions options = {});
  // Waits for a write in flight; commits nothing.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Collective, between steps. Commits the save in flight (as wait()), then
  // snapshots the state of ROOT/step_<steps run> and starts its write;
  // returns after the snapshot with info.seconds its time. Returns
  // info.bytes == 0 and starts nothing when `latest` already names this
  // step. Throws IoError on every rank when any rank failed (this save or
  // the one it committed); the previous checkpoint stays `latest`.
  CheckpointInfo save_async();
  // Collective: waits for this rank's write in flight and commits it (every
  // rank's files complete, then the manifest, rename and `latest`). Returns
  // the committed save, or nullopt when none was in flight. Throws as
  // save_async does.
  std::optional<CheckpointInfo> wait();

  // Whether a save is in flight (snapshotted, not yet committed). The same
  // on every rank.
  bool pending() const { return pending_ != nullptr; }
  // Whether this rank's write of the save in flight has ended (written or
  // failed), or none is in flight. Not collective; never blocks.
  bool written() const;
  // The snapshot's host bytes on this rank (0 before the first save).
  size_t snapshot_bytes() const;

 private:
  struct Pending;
  void join();
  void join_prune();

  Engine& engine_;
  std::string root_;
  CheckpointSaveOptions options_;
  PinnedBuffer snapshot_;
  std::unique_ptr<Pending> pending_;
  std::thread prune_;  // rank 0: old checkpoints removed after a commit
};

// Loads a checkpoint directory into the engine: weights, optimizer
// moments, step counts and loss-scaler state. Collective. Returns the
// manifest (config, data position).
proto::CheckpointManifest load_checkpoint(Engine& engine, const std::string& checkpoint_dir,
                                          CheckpointInfo* info = nullptr);

// resolve_checkpoint, read_checkpoint_manifest and verify_checkpoint, which
// need no engine: formats/checkpoint_format.h.

}  // namespace mp

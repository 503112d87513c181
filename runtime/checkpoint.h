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
#include <string>

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
  double seconds = 0;       // wall time of the save or load on this rank
};

// Saves the engine's state as ROOT/step_<steps run>. Collective over the
// engine's world; call between steps. If that directory already exists
// and `latest` names it, nothing is written (the state of a step is saved
// once). Throws IoError on every rank if any rank failed; the previous
// checkpoint stays valid.
CheckpointInfo save_checkpoint(Engine& engine, const std::string& root, const CheckpointSaveOptions& options = {});

// Loads a checkpoint directory into the engine: weights, optimizer
// moments, step counts and loss-scaler state. Collective. Returns the
// manifest (config, data position).
proto::CheckpointManifest load_checkpoint(Engine& engine, const std::string& checkpoint_dir,
                                          CheckpointInfo* info = nullptr);

// resolve_checkpoint, read_checkpoint_manifest and verify_checkpoint, which
// need no engine: formats/checkpoint_format.h.

}  // namespace mp

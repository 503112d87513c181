// runtime/memory_plan.h: the long-lived bytes per category on each rank,
// predicted from the model, the config and the world size alone, before
// anything runs (`mp_worker --plan --world-size 1024`).
//
// The engine allocates every long-lived buffer once, through the
// accounting allocator (core/allocator.h), so its measured bytes per
// category equal these predictions exactly; tests assert it for every
// strategy and recipe. The model's activations and workspace are not the
// engine's to know: the launcher puts the model's own figure
// (Gpt::activation_bytes, GptCuda::workspace_bytes, Mlp::activation_bytes)
// in bytes[kActivations] before printing. Not covered: the communicator's
// own kFp32 accumulation scratch (at most comm.accumulate_chunk_bytes per
// communicator, reported separately).
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "models/flat_layout.h"
#include "runtime/engine_options.h"

namespace mp {

struct MemoryPlan {
  int world_size = 1;
  int64_t params = 0;  // model parameters (no padding)
  std::array<size_t, kNumMemCategories> bytes{};
  size_t communicator_scratch_bytes = 0;  // upper bound, outside `bytes`
  // Host memory of asynchronous checkpoint saves (Note [Asynchronous
  // saves] in runtime/checkpoint.h): the snapshot of what this rank writes,
  // outside `bytes` (pinned host memory, not the device's allocator). Set by
  // the launcher when checkpoint.async_save is on: plan_checkpoint_snapshot.
  size_t checkpoint_snapshot_bytes = 0;

  size_t at(MemCategory c) const { return bytes[static_cast<size_t>(c)]; }
  size_t total() const;
  double bytes_per_param(MemCategory c) const;
  double total_bytes_per_param() const;
  // A table: category, bytes (human), bytes per parameter.
  std::string to_string() const;
};

// Optimizer kind MUON's exchange holds the matrices each rank owns (Note
// [Muon owners] in optim/muon.h), so ranks differ: the plan of shard rank
// `shard_rank`, or with -1 the rank with the most bytes (what --plan prints
// and the search compares). Other kinds: every rank alike. `device`: where
// the engine runs (Muon's Newton-Schulz scratch differs between devices).
MemoryPlan plan_memory(const ModelSpec& model, const EngineOptions& options, int shard_rank = -1,
                       Device device = Device::cpu());
MemoryPlan plan_memory(const ModelSpec& model, const proto::EngineConfig& config, int world_size);

// The host snapshot of an asynchronous checkpoint save on replica rank 0 of
// its shards (the largest: replicas split a shard, the first ones get the
// extra element): the image of its shard file (checkpoint_image_bytes:
// master, param, remainder and moments of its part of each unit's shard,
// the header and alignment), as CheckpointWriter::snapshot_bytes()
// measures it.
size_t plan_checkpoint_snapshot(const ModelSpec& model, const EngineOptions& options);

}  // namespace mp

// comm/mesh.h: process groups of a 2-D (replicate x shard) mesh, for
// HYBRID_SHARD: FULL_SHARD inside groups of `shard_size` consecutive ranks,
// replicated across size / shard_size groups. World rank r sits at
// (replicate = r / shard_size, shard = r % shard_size).
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace mp {

struct MeshGroups {
  int shard_size = 1;
  int replicate_size = 1;
  std::unique_ptr<Communicator> shard;      // the ranks sharing one replica's shards
  std::unique_ptr<Communicator> replicate;  // the ranks holding the same shard
};

// Collective over `world`. Throws ConfigError unless shard_size divides
// world.size().
MeshGroups make_mesh(Communicator& world, int shard_size);

}  // namespace mp

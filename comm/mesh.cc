#include "comm/mesh.h"

#include "core/error.h"

namespace mp {

MeshGroups make_mesh(Communicator& world, int shard_size) {
  const int n = world.size();
  if (shard_size < 1 || n % shard_size != 0) {
    MP_THROW(ConfigError, "shard group size ", shard_size, " must divide the world size ", n,
             " (HYBRID_SHARD needs equal groups)");
  }
  MeshGroups m;
  m.shard_size = shard_size;
  m.replicate_size = n / shard_size;
  const int r = world.rank();
  m.shard = world.split(r / shard_size, r % shard_size, world.name() + ".shard");
  m.replicate = world.split(r % shard_size, r / shard_size, world.name() + ".replicate");
  return m;
}

}  // namespace mp

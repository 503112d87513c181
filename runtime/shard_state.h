// runtime/shard_state.h: the engine's sharded state as a read/write view,
// what checkpoints (runtime/checkpoint.h) save and load. Engine::shard_state()
// returns one; use it between steps only.
//
// Each unit's shard is the global element range [shard_begin(u),
// shard_begin(u) + shard_numel(u)) of the unit's padded flat buffer
// (models/flat_layout.h). fields(u) lists what this rank stores for it, in a
// fixed order (master, param, remainder, state0, state1; those the precision
// policy keeps), each shard_numel(u) elements of its dtype as seen here, in
// the engine's device memory: read and write them through read() and
// write() (Note [Host staging] in runtime/host_staging.h), never through the
// pointer. state1 keeps nothing for the elements the fused update skips
// (Muon's matrices; UnitState::field_pieces): they read as zeros and
// writes to them are dropped.
// Replicas (replicate_size() > 1) hold the same shards.
//
// Writing through the view: write the fields and the optimizer's state, then
// set_steps_run() and replaced(), which drops every gathered copy of the old
// weights and gathers again where the strategy keeps full parameters
// (collective over the shard group).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/pinned.h"
#include "runtime/engine.h"
#include "runtime/shard_field.h"

namespace mp {

class ShardStateView {
 public:
  Communicator& world() const;
  const EngineOptions& options() const;
  const FlatLayout& layout() const;
  Optimizer& optimizer() const;  // counters and loss-scaler state
  Device device() const;         // where the fields live
  int replicate_rank() const;    // this rank's index among the replicas of its shards
  int replicate_size() const;

  int64_t shard_begin(int unit) const;
  int64_t shard_numel(int unit) const;
  std::vector<ShardField> fields(int unit) const;

  // A host pointer to elements [begin, begin + count) (shard-relative) of
  // field `field` of unit `unit`, valid until `staging` changes: the memory
  // itself on the CPU, a copy in `staging` otherwise.
  const char* read(int unit, int field, int64_t begin, int64_t count, std::vector<char>& staging) const;
  // The same elements copied to `snapshot` at byte `offset` (count * element
  // bytes must fit): one stream-ordered copy into host memory pinned for the
  // engine's device (core/pinned.h); returns once they are there.
  void read_into(int unit, int field, int64_t begin, int64_t count, const PinnedBuffer& snapshot,
                 int64_t offset) const;
  // The same range to fill on the host, then commit_write() with the same
  // arguments stores it.
  char* write_target(int unit, int field, int64_t begin, int64_t count, std::vector<char>& staging);
  void commit_write(int unit, int field, int64_t begin, int64_t count, std::vector<char>& staging);

  int64_t steps_run() const;
  void set_steps_run(int64_t steps);
  // After the fields were written: drops and redoes gathered copies. Collective.
  void replaced();

 private:
  friend class Engine;
  explicit ShardStateView(Engine::Impl& impl) : impl_(&impl) {}
  // Where elements [begin, begin + count) of a field are.
  struct Located {
    std::vector<ShardFieldPiece> pieces;
    int64_t element_bytes = 0;
    char* whole = nullptr;  // all of them in one stored span (every field but a compact state1), else null
  };
  Located locate(int unit, int field, int64_t begin, int64_t count) const;

  Engine::Impl* impl_;
};

}  // namespace mp

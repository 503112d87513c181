// runtime/shard_field.h: one stored field of a unit's shard and where its
// elements are (runtime/shard_state.h's view; UnitState::field_pieces).
#pragma once

#include <cstdint>
#include <string>

namespace mp {

// One stored field of a unit's shard.
struct ShardField {
  std::string name;           // "master", "param", "remainder", "state0", "state1"
  std::string dtype;          // "fp32", "bf16", "fp16", "int16"
  int64_t element_bytes = 0;
  char* device_data = nullptr;  // the engine's device memory: shard_numel elements (a compact state1 fewer)
};

// Where some elements of a field are (UnitState::field_pieces): `count`
// elements from shard-relative `begin` at `data` in device memory, or null
// where the field keeps nothing (state1 of the elements the fused update
// skips: read as zeros, written nowhere).
struct ShardFieldPiece {
  int64_t begin = 0;
  int64_t count = 0;
  char* data = nullptr;
};

}  // namespace mp

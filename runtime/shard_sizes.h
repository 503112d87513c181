// runtime/shard_sizes.h: what a shard rank holds of a unit, as functions of
// the layout alone: the memory plan (runtime/memory_plan.h) and the parts
// of the engine that allocate it compute it here, the same way.
#pragma once

#include <cstdint>
#include <vector>

#include "models/flat_layout.h"
#include "optim/optimizer.h"

namespace mp {

// The parameters in a unit's shard [offset, offset + n), shard-relative,
// Muon's marked to be skipped when `muon` (the optimizer is MUON).
std::vector<ShardParam> shard_params(const UnitLayout& ul, int64_t offset, int64_t n, bool muon);

// Elements each rank quantizes for an int8 gather of a shard of
// `shard_numel` (whole blocks).
int64_t int8_gather_elements(int64_t shard_numel);

}  // namespace mp

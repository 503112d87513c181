// runtime/shard_sizes.cc: runtime/shard_sizes.h.
#include "runtime/shard_sizes.h"

#include <algorithm>

#include "kernels/quant_math.h"

namespace mp {

std::vector<ShardParam> shard_params(const UnitLayout& ul, int64_t offset, int64_t n, bool muon) {
  std::vector<ShardParam> params;
  for (const ParamPlacement& pp : ul.params) {
    const int64_t b = std::max(pp.offset, offset), e = std::min(pp.offset + pp.numel, offset + n);
    if (b < e) {
      params.push_back(ShardParam{pp.name, b - offset, e - offset, static_cast<int>(pp.shape.size()), pp.muon && muon});
    }
  }
  return params;
}

int64_t int8_gather_elements(int64_t shard_numel) {
  return (shard_numel + math::kQuantBlock - 1) / math::kQuantBlock * math::kQuantBlock;
}

}  // namespace mp

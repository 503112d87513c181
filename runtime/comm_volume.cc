#include "runtime/comm_volume.h"

#include <algorithm>
#include <vector>

namespace mp {
namespace {

// What a ring sends from each rank, over a group of g, for an all-gather
// or reduce-scatter of `bytes` (Note [Communication volume]).
double ring(int g, double bytes) { return g > 1 ? static_cast<double>(g - 1) / g * bytes : 0.0; }

// Units gathered per step by FULL_SHARD and HYBRID_SHARD's ring.
double gathered_elements(const FlatLayout& layout, const EngineOptions& o, const std::vector<bool>& recomputed) {
  const int units = layout.num_units();
  const int kept = std::min(o.prefetch_depth + 1, units);  // left in the ring by the last pass
  double forward = 0, forward_later = 0, backward = 0;
  for (int u = 0; u < units; ++u) {
    const auto n = static_cast<double>(layout.unit(u).padded_numel);
    forward += n;
    if (u >= kept) forward_later += n;
    const bool reads = layout.unit(u).backward_reads_params || recomputed[static_cast<size_t>(u)];
    if (reads && u < units - kept) backward += n;
  }
  return forward + (o.micro_batches - 1) * forward_later + o.micro_batches * backward;
}

double total_padded(const FlatLayout& layout) {
  double n = 0;
  for (const UnitLayout& u : layout.units()) n += static_cast<double>(u.padded_numel);
  return n;
}

// The bytes of one gradient element on the wire.
double wire_bytes(const EngineOptions& o) {
  if (o.deterministic) return 4.0;
  if (o.strategy == proto::ShardingConfig::NO_SHARD && !o.comm_hook.empty()) {
    if (o.comm_hook.rfind("int8", 0) == 0) return 1.0;
    if (o.comm_hook != "fp32") return 2.0;
    return 4.0;
  }
  return static_cast<double>(dtype_size(o.precision.reduce_dtype));
}

}  // namespace

CommVolume plan_comm_volume(const ModelSpec& model, const EngineOptions& o) {
  using SC = proto::ShardingConfig;
  const FlatLayout layout(model, o.shard_size);
  const std::vector<bool> recomputed = recomputed_units(model, o.recompute_every);
  const double param_bytes = o.int8_param_gather ? 1.0 : static_cast<double>(dtype_size(o.precision.param_dtype));
  const double all = total_padded(layout);
  CommVolume v;
  if (o.gathers_per_unit()) {
    v.gather_bytes = ring(o.shard_size, gathered_elements(layout, o, recomputed) * param_bytes);
  } else if (o.keeps_full_params()) {
    v.gather_bytes = ring(o.shard_size, all * param_bytes);
  }
  const double grads = all * wire_bytes(o);
  if (o.strategy == SC::NO_SHARD) {
    v.reduce_bytes = 2 * ring(o.world_size, grads);
  } else {
    const int reductions = o.full_grad_accumulators() ? 1 : o.micro_batches;
    v.reduce_bytes = reductions * ring(o.shard_size, grads);
    v.replicate_bytes = 2 * ring(o.replicate_size, grads / o.shard_size);
  }
  return v;
}

}  // namespace mp

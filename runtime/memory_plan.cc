#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "comm/hooks.h"
#include "core/error.h"
#include "formats/checkpoint_format.h"
#include "kernels/cpu/quant.h"
#include "runtime/muon_plan.h"
#include "runtime/shard_sizes.h"

namespace mp {

size_t MemoryPlan::total() const {
  size_t t = 0;
  for (size_t b : bytes) t += b;
  return t;
}

double MemoryPlan::bytes_per_param(MemCategory c) const {
  return params > 0 ? static_cast<double>(at(c)) / static_cast<double>(params) : 0.0;
}

double MemoryPlan::total_bytes_per_param() const {
  return params > 0 ? static_cast<double>(total()) / static_cast<double>(params) : 0.0;
}

std::string MemoryPlan::to_string() const {
  std::ostringstream s;
  char line[160];
  std::snprintf(line, sizeof line, "%-18s %16s %12s\n", "category", "bytes per rank", "B/param");
  s << line;
  auto row = [&](const char* name, size_t b) {
    std::snprintf(line, sizeof line, "%-18s %16zu %12.4f\n", name, b,
                  params > 0 ? static_cast<double>(b) / static_cast<double>(params) : 0.0);
    s << line;
  };
  for (int c = 0; c < kNumMemCategories; ++c) {
    const auto cat = static_cast<MemCategory>(c);
    // The model's activations are the launcher's to add (the engine's plan
    // knows only the spec); a plan with none leaves the row out.
    if (cat == MemCategory::kOther || (cat == MemCategory::kActivations && at(cat) == 0)) continue;
    row(std::string(mem_category_name(cat)).c_str(), at(cat));
  }
  row("total", total());
  if (communicator_scratch_bytes > 0) row("(communicator, at most)", communicator_scratch_bytes);
  if (checkpoint_snapshot_bytes > 0) row("(checkpoint snapshot, host)", checkpoint_snapshot_bytes);
  return s.str();
}

namespace {

// AdamW's second moments kept on `shard_rank` (compact_state1), or on the
// rank with the most: every element's but Muon's matrices'.
int64_t state1_elements(const FlatLayout& layout, const EngineOptions& o, int shard_rank) {
  int64_t most = 0;
  for (int r = 0; r < o.shard_size; ++r) {
    if (shard_rank >= 0 && r != shard_rank) continue;
    int64_t sum = 0;
    for (const UnitLayout& u : layout.units()) {
      const int64_t n = u.shard_numel;
      sum += o.muon ? compact_state1_numel(shard_params(u, r * n, n, true), n) : n;
    }
    most = std::max(most, sum);
  }
  return most;
}

}  // namespace

MemoryPlan plan_memory(const ModelSpec& model, const EngineOptions& o, int shard_rank, Device device) {
  const FlatLayout layout(model, o.shard_size);
  const Precision& p = o.precision;
  const size_t ps = dtype_size(p.param_dtype);
  MemoryPlan plan;
  plan.world_size = o.world_size;
  plan.params = layout.total_numel();
  auto add = [&](MemCategory c, int64_t elements, size_t element_bytes) {
    plan.bytes[static_cast<size_t>(c)] += static_cast<size_t>(elements) * element_bytes;
  };
  const int64_t p_max = layout.max_padded_numel();
  const int64_t n_max = layout.max_shard_numel();
  for (const UnitLayout& u : layout.units()) {
    const int64_t n = u.shard_numel;
    const int64_t full = u.padded_numel;
    // Master and the low-precision shard.
    if (p.master == MasterMode::kFp32) add(MemCategory::kMaster, n, 4);
    if (p.master == MasterMode::kBf16Remainder) add(MemCategory::kMaster, n, 2);
    if (o.persistent_param_shard()) add(MemCategory::kParamShards, n, ps);
    if (o.state_count >= 1) add(MemCategory::kOptimizerState, n, dtype_size(p.state_dtype));
    // Gradients.
    if (o.deterministic) {
      add(MemCategory::kGradient, n, 8);  // fp64 accumulator
      add(MemCategory::kGradient, n, 4);  // the rounded shard the update reads
    } else {
      if (o.full_grad_accumulators()) add(MemCategory::kGradient, full, dtype_size(p.grad_accum_dtype));
      if (o.strategy != proto::ShardingConfig::NO_SHARD) add(MemCategory::kGradient, n, dtype_size(o.grad_shard_dtype()));
    }
    if (o.keeps_full_params()) add(MemCategory::kGatheredParams, full, ps);
    // The hook's buffers per bucket: the unit (NO_SHARD), or its shard
    // all-reduced across replicas (HYBRID_SHARD).
    if (o.strategy == proto::ShardingConfig::NO_SHARD) {
      add(MemCategory::kCommScratch, 1, comm_hook_scratch_bytes(o.comm_hook, full, o.replicate_size));
    } else if (o.replicate_size > 1 && !o.comm_hook.empty()) {
      add(MemCategory::kCommScratch, 1, comm_hook_scratch_bytes(o.comm_hook, n, o.replicate_size));
    }
  }
  // Full-size buffers: shared ones sized by the largest unit that is not
  // oversized, and each oversized unit's own (Note [Oversized units]).
  const int64_t shared = layout.shared_padded_numel();
  int64_t oversized = 0;
  for (const UnitLayout& u : layout.units()) oversized += u.oversized ? u.padded_numel : 0;
  if (!o.local_reduction()) {  // the backward's gradients, double-buffered
    add(MemCategory::kGradient, 2 * shared + oversized, dtype_size(o.grad_buffer_dtype()));
  }
  if (o.gathers_per_unit()) add(MemCategory::kGatheredParams, o.gather_slots(layout.num_shared_units()) * shared + oversized, ps);
  if (p.param_cast == ParamCast::kAtGather) {
    add(MemCategory::kCommScratch, o.shard_size > 1 ? n_max : o.cast_staging_slots() * p_max, ps);
  }
  if (o.int8_param_gather && o.gathers_per_unit()) {  // ParamGathers' int8 staging
    const int64_t nq = int8_gather_elements(n_max);
    add(MemCategory::kCommScratch, 1 + o.shard_size, int8_span_bytes(nq));
    add(MemCategory::kCommScratch, nq, 4);
  }
  if (o.wire_staging() && !o.local_reduction()) add(MemCategory::kCommScratch, p_max, dtype_size(p.reduce_dtype));
  if (o.strategy == proto::ShardingConfig::NO_SHARD && !o.deterministic && o.comm_hook.empty() &&
      (p.reduce_dtype != p.grad_accum_dtype || p.loss_scaling != LossScalingMode::kNone)) {
    add(MemCategory::kCommScratch, p_max, dtype_size(p.reduce_dtype));  // NO_SHARD's cast of the bucket
  }
  if (!o.deterministic && o.sharded_accumulation && o.micro_batches > 1 && !o.full_grad_accumulators()) {
    add(MemCategory::kCommScratch, n_max, dtype_size(o.reduce_out_dtype()));  // one micro-batch's shard
  }
  if (o.deterministic) {
    if (o.shard_size > 1) add(MemCategory::kCommScratch, p_max, 4);                    // all-to-all output
    if (o.replicate_size > 1) add(MemCategory::kCommScratch, o.replicate_size * p_max, 4);  // all-gather across replicas
  }
  if (o.state_count >= 2) {
    add(MemCategory::kOptimizerState, state1_elements(layout, o, shard_rank), dtype_size(p.state_dtype));
  }
  if (o.muon) {  // the exchange's buffers (Note [Muon in the engine]) on shard_rank, or the most on any rank
    const std::vector<int64_t> ranks = muon_scratch_bytes(layout, *o.muon, o.shard_size, device);
    MP_ENFORCE(shard_rank < o.shard_size, "shard rank ", shard_rank, " of ", o.shard_size);
    add(MemCategory::kCommScratch, 1,
        shard_rank >= 0 ? ranks[static_cast<size_t>(shard_rank)] : *std::max_element(ranks.begin(), ranks.end()));
  }
  // The communicators' own kFp32 accumulation scratch: at most
  // accumulate_chunk_bytes each, in the shard and the replicate group.
  if (p.reduce_accumulate == ReduceAccumulate::kFp32 && !o.deterministic) {
    plan.communicator_scratch_bytes = o.accumulate_chunk_bytes * (o.replicate_size > 1 && o.shard_size > 1 ? 2 : 1);
  }
  return plan;
}

size_t plan_checkpoint_snapshot(const ModelSpec& model, const EngineOptions& o) {
  const FlatLayout layout(model, o.shard_size);
  const Precision& p = o.precision;
  // Bytes per element of each stored field (UnitState::fields).
  std::vector<int64_t> field_bytes;
  if (p.master == MasterMode::kFp32) field_bytes.push_back(4);
  if (o.persistent_param_shard()) field_bytes.push_back(static_cast<int64_t>(dtype_size(p.param_dtype)));
  if (p.master == MasterMode::kBf16Remainder) field_bytes.push_back(2);
  for (int i = 0; i < o.state_count; ++i) field_bytes.push_back(static_cast<int64_t>(dtype_size(p.state_dtype)));
  const int64_t replicas = std::max(1, o.replicate_size);
  std::vector<int64_t> chunks;  // replica rank 0's part of each unit's shard, per field
  for (const UnitLayout& u : layout.units()) {
    const int64_t first_part = (u.shard_numel + replicas - 1) / replicas;
    if (first_part == 0) continue;
    for (const int64_t b : field_bytes) chunks.push_back(first_part * b);
  }
  return static_cast<size_t>(checkpoint_image_bytes(chunks));
}

MemoryPlan plan_memory(const ModelSpec& model, const proto::EngineConfig& config, int world_size) {
  return plan_memory(model, resolve_engine_options(config, world_size));
}

}  // namespace mp

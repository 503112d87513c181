// runtime/engine_options.h: an EngineConfig (proto/mp.proto) resolved for a
// world size and validated, plus the buffer decisions that follow from it.
// The engine (runtime/engine.h) and the memory plan (runtime/
// memory_plan.h) both start from these options.
#pragma once

#include <optional>
#include <string>

#include "optim/muon.h"
#include "proto/mp.pb.h"
#include "runtime/precision.h"

namespace mp {

using Strategy = proto::ShardingConfig::Strategy;

std::string_view strategy_name(Strategy s);  // "FULL_SHARD", ...
// Inverse of strategy_name (case-insensitive); throws ConfigError listing them.
Strategy parse_strategy(std::string_view name);

struct EngineOptions {
  Strategy strategy = proto::ShardingConfig::FULL_SHARD;
  int world_size = 1;
  int shard_size = 1;      // S: ranks sharing one copy's shards
  int replicate_size = 1;  // R = world_size / S
  int prefetch_depth = 1;
  int held_units = 0;      // sharding.held_units
  bool param_dtype_gradients = false;  // sharding.param_dtype_gradients
  int micro_batches = 1;
  bool sharded_accumulation = true;
  bool deterministic = false;
  bool optimizer_in_backward = false;
  bool serialize_communication = false;
  bool int8_param_gather = false;  // sharding.int8_param_gather (qwZ)
  bool stop_on_non_finite = false;  // non_finite = NON_FINITE_STOP, without loss scaling
  int max_consecutive_skips = 50;
  bool locate_non_finite = false;
  // activation_checkpointing: 0 none, 1 every recomputable unit, k every
  // k-th of them (recomputed_units in models/flat_layout.h).
  int recompute_every = 0;
  uint64_t seed = 0;
  std::string comm_hook;  // NO_SHARD with comm.comm_hook set
  Precision precision;
  int state_count = 2;  // optimizer state arrays per element (Optimizer::state_count)
  // A kind with whole matrices (MUON): their settings, by which the memory
  // plan sizes the exchange (Note [Muon in the engine] in runtime/muon_exchange.h).
  std::optional<MuonHyper> muon;
  size_t accumulate_chunk_bytes = 0;  // comm.accumulate_chunk_bytes, resolved

  // FULL_SHARD and HYBRID_SHARD over more than one rank: units are gathered
  // into a ring of prefetch_depth + 1 + held_units buffers (at most one per
  // unit that shares them), and oversized units each into their own.
  bool gathers_per_unit() const;
  int gather_slots(int num_units) const;
  // SHARD_OPTIMIZER and SHARD_GRAD_OP over more than one rank: every unit's
  // full params stay gathered; refreshed by one all-gather after the update.
  bool keeps_full_params() const;
  // One rank per shard group with CAST_AT_GATHER: the master is cast for
  // compute into one of 1 + held_units staging buffers.
  int cast_staging_slots() const { return 1 + held_units; }
  // Full-size per-unit gradient accumulators (NO_SHARD, SHARD_OPTIMIZER,
  // or UNSHARDED accumulation over several micro-batches).
  bool full_grad_accumulators() const;
  // dtype of the reduced gradient shard the update reads.
  DType reduce_out_dtype() const;
  DType grad_shard_dtype() const;
  // A persistent param_dtype shard per unit (what the update writes and
  // the all-gather sends).
  bool persistent_param_shard() const;
  // The dtype of the gradient buffers a backward writes (Note [Gradient
  // reduction]): fp32, or the param dtype with param_dtype_gradients where
  // that is what goes on the wire.
  DType grad_buffer_dtype() const;
  // The wire staging buffer: gradients are cast or scaled on their way
  // into the reduction.
  bool wire_staging() const;
  // One rank, one micro-batch, an fp32 gradient shard, not deterministic:
  // nothing to communicate; the backward writes the gradient shard itself
  // and needs no gradient or wire buffers (Note [Gradient reduction]).
  bool local_reduction() const;
};

// Throws ConfigError naming the field: "sharding.hybrid_shard_size = 3 does
// not divide the world size 4", "deterministic needs precision.reduce_dtype
// FP32", ...
// activation_checkpointing as recomputed_units' k (0: none); ConfigError
// naming the field for a bad policy or k.
int recompute_every(const proto::ActivationCheckpointing& config);

EngineOptions resolve_engine_options(const proto::EngineConfig& config, int world_size);

}  // namespace mp

// runtime/comm_volume.h: the bytes one rank sends per optimizer step, by
// collective, predicted from the model, the engine's options and the world
// size alone (as the memory plan predicts bytes), so that configurations
// can be compared before anything runs (mp_worker --plan --memory-per-rank).
//
// Note [Communication volume]
// Each collective is counted as a ring moves it, which is what NCCL's and
// Open MPI's large-message algorithms send: over a group of G ranks, an
// all-gather or a reduce-scatter of B bytes sends (G - 1) / G * B from each
// rank, an all-reduce twice that. Per step, with m micro-batches, U units
// of padded sizes P_u, a ring of k + 1 gathered units:
// - FULL_SHARD and HYBRID_SHARD gather each unit in the forward of every
//   micro-batch, but the first k + 1 units after the first micro-batch
//   (the backward left them in the ring), and again for the backward, but
//   the last k + 1 units (the forward left them) and units whose backward
//   reads no parameters (and are not recomputed: Note [Activation
//   recomputation]), in the param dtype (1 byte with int8_param_gather);
//   SHARD_GRAD_OP and SHARD_OPTIMIZER all-gather every unit once, after the
//   update; NO_SHARD gathers nothing.
// - Gradients: reduce-scattered every micro-batch (sharded accumulation)
//   or once (full accumulators: SHARD_OPTIMIZER, UNSHARDED), all-reduced
//   once for NO_SHARD, in the reduce dtype (the comm hook's wire dtype for
//   NO_SHARD with one; int8 with its per-block scales counted as 1 byte);
//   HYBRID_SHARD then all-reduces each shard across the replicas once.
//   Deterministic mode's all-to-all of fp32 gradients counts as a
//   reduce-scatter of fp32.
// The scalar exchanges (statistics, agreement, losses) are a few bytes and
// not counted. It is an estimate of traffic, not of time: how much of it
// overlaps compute depends on the machine.
#pragma once

#include <cstdint>

#include "models/flat_layout.h"
#include "runtime/engine_options.h"

namespace mp {

struct CommVolume {
  double gather_bytes = 0;     // parameter all-gathers
  double reduce_bytes = 0;     // gradient reduce-scatters (all-reduce for NO_SHARD)
  double replicate_bytes = 0;  // HYBRID_SHARD's all-reduce across replicas
  double total() const { return gather_bytes + reduce_bytes + replicate_bytes; }
};

CommVolume plan_comm_volume(const ModelSpec& model, const EngineOptions& options);

}  // namespace mp

// runtime/grad_reducer.h: the engine's gradient path, from the fp32
// gradients of one unit's backward to the reduced shard the update reads
// (Note [Engine schedule] in runtime/engine.h). Internal to the engine.
//
// Note [Gradient reduction]
// The backward writes each unit's gradients into one of two buffers, or an
// oversized unit's into its own (Note [Oversized units] in
// models/flat_layout.h), in grad_buffer_dtype (fp32, or the param dtype
// where that goes on the wire as it is: sharding.param_dtype_gradients)
// (take_buffer); reduce() then issues the unit's reduction on the
// communication thread, so the compute thread goes on with the next unit:
// - deterministic: every rank's fp32 gradient for this shard reaches this
//   rank (all-to-all in the shard group, then all-gather across replicas)
//   and is added in fp64 in global rank order; the last micro-batch rounds
//   once into the shard;
// - full accumulators (NO_SHARD, SHARD_OPTIMIZER, UNSHARDED accumulation):
//   summed over micro-batches in grad_accum_dtype, reduced once after the
//   last (all-reduce for NO_SHARD, through comm.comm_hook when set;
//   reduce-scatter otherwise), the cast into the wire dtype carrying the
//   mean over micro-batches and the loss scale (mean_at_cast);
// - sharded: reduce-scatter every micro-batch, added into the shard in
//   grad_accum_dtype; HYBRID_SHARD then all-reduces the shard across
//   replicas (after the full accumulators' reduce-scatter too);
// - local (EngineOptions::local_reduction: one rank, one micro-batch, an
//   fp32 shard) has nothing to communicate. The backward writes straight
//   into the unit's gradient shard (take_buffer hands it out; no gradient
//   or wire buffers are allocated). With a 16-bit wire or a loss scale the
//   shard must then get the bits the one-rank reduce-scatter would leave:
//   rounded through the wire dtype (the loss scale divided out), widened
//   back. The statistics pass, which reads the shard anyway, rounds it in
//   place (local_rounding(): the engine hands it to
//   GradStatistics::take_shard), so the gradients are read once after the
//   backward, not twice.
// Invariants:
// - A unit's reduction starts on the communication stream only after the
//   compute that wrote its gradients (the `computed` event of reduce()).
// - A gradient buffer is written again only after the communication
//   stream is done reading it (the compute stream waits for its grad_free
//   event before the gaps are zeroed and the backward runs); the scratch buffers
//   (wire, rs_scratch, recv, gathered) are reused in stream order, recv
//   only after the replicas finished reading it (replicate_done).
// - The reduced shard still carries divisor() (what it is to be divided by).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "comm/hooks.h"
#include "comm/mesh.h"
#include "kernels/ops.h"
#include "runtime/comm_watch.h"
#include "runtime/unit_state.h"

namespace mp {

// A gradient buffer of the backward: the unit's padded elements.
struct GradBuffer {
  Tensor grads;
  int index = 0;  // which buffer (0, 1: shared; 2..: oversized units' own); -1: the gradient shard itself (local)
};

class GradReducer {
 public:
  GradReducer(const EngineOptions& o, const FlatLayout& layout, std::vector<UnitState>& units, MeshGroups& mesh,
              Stream& shard_stream, Stream& replicate_stream, Stream& compute, const Optimizer& opt,
              CommWatch& comm, Allocator& alloc);

  // A buffer for unit u's gradients: `compute` waits until the communication
  // stream is done with its previous contents, then zeroes the alignment
  // gaps and padding.
  GradBuffer take_buffer(int u, Stream& compute);
  // Issues unit u's reduction of micro-batch `micro_batch` from `g`, after
  // `computed` (the backward that wrote g); returns the stream it ends on.
  Stream& reduce(int u, int micro_batch, const GradBuffer& g, const Event& computed);
  // What the reduced gradients are still to be divided by: micro-batches,
  // ranks (deterministic) and the static loss scale.
  double divisor() const;
  // The local path's rounding, for the statistics pass to apply in place
  // (before anything else reads the shard); none on every other path.
  std::optional<ops::RoundThrough> local_rounding() const;

 private:
  Stream& reduce_deterministic(int u, int micro_batch, const Tensor& g, int index);
  Stream& reduce_full_accumulator(int u, int micro_batch, const Tensor& g, int index);
  Stream& reduce_across_replicas(int u, const ReduceOptions& ro);
  Stream& reduce_sharded(int u, int micro_batch, const Tensor& g, int index);
  Stream& reduce_local();
  Stream& grad_stream();
  double loss_scale_now() const;

  const EngineOptions& o_;
  const FlatLayout& layout_;
  std::vector<UnitState>& units_;
  MeshGroups& mesh_;
  Stream& shard_stream_;
  Stream& replicate_stream_;
  Stream& compute_;
  const Optimizer& opt_;
  CommWatch& comm_;
  std::unique_ptr<CommHook> hook_;
  std::vector<Tensor> grad_in_;  // grad_buffer_dtype: two [shared padded], then each oversized unit's own
  std::vector<Event> grad_free_;
  std::vector<int> own_;         // by unit: the index of its own buffer; -1: shared
  int grad_next_ = 0;
  Tensor wire_;         // reduce dtype [max padded]
  Tensor rs_scratch_;   // reduce_out dtype [max shard]
  Tensor recv_;         // fp32 [max padded] (deterministic all-to-all)
  Tensor gathered_;     // fp32 [R x max padded] (deterministic across replicas)
  Event replicate_done_;  // the last replicate-group use of recv
  // Full accumulators hold the sum over micro-batches; where they are cast
  // for the reduction (wire dtype, loss scale) the cast also divides by the
  // number of micro-batches, so 16-bit wire values do not overflow.
  bool mean_at_cast_ = false;
  bool local_ = false;  // the one-rank path (Note [Gradient reduction])
};

}  // namespace mp

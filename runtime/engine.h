// runtime/engine.h: the sharded engine. It owns the flat parameter units
// (models/flat_layout.h), keeps each rank's shard of master weights,
// optimizer state and gradients in the dtypes of the precision policy,
// and runs a training step around a Model's compute: all-gathers with
// prefetch, reductions issued as soon as a unit's gradients exist, one
// scalar exchange for the global norm and the skip decision, and fused
// updates that write the next all-gather's source.
//
// Note [Engine schedule] (docs/architecture.md "One training step")
// Forward, unit u: wait for u's all-gather (issued earlier as a prefetch),
//   issue the gathers of u+1 .. u+k into free slots of a ring of k+1
//   buffers (k = sharding.prefetch_depth), run forward(u). A gathered unit
//   stays until its slot is reused, so the last k+1 units of the forward are
//   not gathered again for the backward (FSDP keeps the last unit too).
// Backward, unit u: ensure u is gathered (prefetching u-1 .. u-k), run
//   backward(u) into one of two fp32 gradient buffers, then issue u's
//   reduction on the communication thread: cast (and loss-scale) into the
//   wire dtype, reduce-scatter (all-reduce for NO_SHARD; then all-reduce
//   across replicas for HYBRID_SHARD), and accumulate over micro-batches.
//   The compute thread goes on with backward(u-1) meanwhile. A unit whose
//   activations are recomputed (engine.activation_checkpointing) runs its
//   forward again first, on the same gathered parameters (Note [Activation
//   recomputation] in models/model.h).
// Step: per unit, as its reduction lands, the partial sum of squares and a
//   non-finite flag of the gradient shard; one exchange of those over the
//   shard group; the optimizer's decision (optim/optimizer.h); then the
//   fused update of each unit, after which its next all-gather is issued at
//   once (the first k+1 units for FULL_SHARD, every unit for SHARD_GRAD_OP
//   and SHARD_OPTIMIZER), so the gathers overlap the remaining updates.
// With sharding.optimizer_in_backward each unit is updated on the
// communication thread as soon as its last reduction lands; non-finite
// gradients then raise NumericError after the step (it cannot be skipped).
//
// On the CPU the communication thread of each communicator plays the role of
// a CUDA stream, so the overlap is real and the timings below measure it.
// Engine::Impl::step (runtime/engine.cc) reads as this schedule; the parts it
// drives are listed in runtime/engine_impl.h.
//
// Note [Engine events]
// The engine runs on one device (its allocator's, which must be its
// communicators' too). The host thread enqueues: the model's calls and the
// engine's ops (kernels/ops.h) on the compute stream, collectives and their
// casts on the communicators' streams. Nothing is ordered by the host having
// waited: every dependency is an event, listed with its producer and
// consumer in docs/architecture.md ("Streams, events and completion"):
// gathered -> compute, computed -> reduce, grad_free -> next backward into
// that buffer, reduced -> statistics and update, updated -> next gather,
// released -> next gather into a slot, scalars -> updates. The host waits
// for the statistics (one device-to-host read) and for the end of the step.
//
// Note [A failed step]
// When the model's work (or any task on the compute stream) fails on one
// rank, that rank still issues the step's collectives, and its
// communication threads still run them (StreamOptions::inherits_failures
// false; a CUDA stream's device work goes on anyway): no peer waits for it.
// Once the step's compute has run, every rank agrees over the world
// (Communicator::agree): the failed rank throws its own error, the others
// "step N failed on rank R: <its message>" as the same type (ModelError
// for a host's callback), all marked agreed, before any statistics or
// update. A CommError (a timeout, a lost peer) is not agreed on: the rank
// throws it at once, naming the ranks that did not arrive. A failed rank's compute stream stays failed (every later call
// says so), so after a failed step the ranks stop, or make new engines and
// load a checkpoint. evaluate() agrees the same way.
//
// Note [Driving the engine]
// A host that runs its own forward and backward (mp.torch.shard, the C
// ABI's driven calls) calls the steps of this schedule itself, as its
// passes reach each unit; step(model) is the same calls in a fixed order:
//   unshard(u, pass)      u's full parameters (param dtype, the unit's
//                         padded elements), readable by work enqueued on
//                         compute() from now on; prefetches the next units
//                         in index order (descending in the backward)
//   reshard(u)            the work enqueued on compute() so far was the last
//                         to read them; their buffer may be reused
//   gradient_buffer(u)    the unit's padded elements in fp32 (the param
//                         dtype with sharding.param_dtype_gradients, where
//                         that goes on the wire as it is), writable by work
//                         enqueued on compute() from now on (alignment gaps
//                         are ignored)
//   reduce_gradients(u)   the work enqueued so far wrote u's gradients of
//                         this backward: u's reduction is issued at once,
//                         after the gathers of the unit whose backward comes
//                         next
//   note_loss(loss)       optional: a micro-batch's mean loss, for
//                         StepResult::loss (NaN for micro-batches without)
//   finish_step()         after engine.micro_batches backwards (gradient
//                         accumulation): statistics, clipping, the skip
//                         decision, the fused updates, the next gathers.
// A host computing on the CPU (its compute is its own thread, not the
// stream) calls wait_compute() after unshard and gradient_buffer before
// touching the buffers; reshard and reduce_gradients come after its work.
// Order mistakes throw ConfigError naming the unit and the call: a unit
// unsharded twice or resharded while not unsharded, a second gradient
// buffer taken before the first was reduced, more backwards than
// engine.micro_batches, and, agreed over the world before any wait on a
// reduction (so a rank that missed one is named, not waited for), a
// finish_step with a unit still unsharded or reduced fewer times than
// engine.micro_batches. Collectives of ranks whose backwards diverged
// mismatch before finish_step can tell: comm.check_fingerprints names them.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "comm/hooks.h"
#include "models/flat_layout.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "runtime/engine_options.h"
#include "runtime/memory_plan.h"

namespace mp {

// Seconds spent by the calling thread in each phase of the last step.
struct StepTimings {
  double compute_s = 0;         // the model's forward and backward on the compute stream
  double exposed_comm_s = 0;    // the compute stream (or host) blocked on communication
  double update_s = 0;          // gradient statistics and fused updates on the compute stream
  double total_s = 0;
};

struct StepResult {
  int64_t step = 0;         // 1-based count of steps run (skipped included)
  double loss = 0;          // mean over every micro-batch of every rank
  double grad_norm = 0;     // global norm of the true gradient (NaN when non-finite)
  bool skipped = false;
  double loss_scale = 1;
  double lr = 0;
  // Elements cast from the fp32 master to param_dtype outside the fused
  // update this step (CAST_AT_GATHER casts before every gather; 0 otherwise).
  int64_t param_cast_elements = 0;
  // A skipped step with locate_non_finite: the lowest rank whose own
  // gradients (before any reduction) held NaN or Inf, and the first such
  // unit of that rank's backward; -1 when no rank's did (an overflow in the
  // reduction itself) or without locate_non_finite.
  int non_finite_rank = -1;
  int non_finite_unit = -1;
  int64_t consecutive_skips = 0;  // skipped steps in a row, this one included
  StepTimings timings;
};

class ShardStateView;  // runtime/shard_state.h

class Engine {
 public:
  // Collective over `world` (it splits the shard and replicate groups).
  // Every long-lived buffer is allocated here, through `allocator`.
  // Throws ConfigError for a bad config and names the field.
  Engine(const ModelSpec& spec, const proto::EngineConfig& config, Communicator& world,
         Allocator allocator = Allocator());
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineOptions& options() const;
  const FlatLayout& layout() const;
  // Per unit: whether engine.activation_checkpointing recomputes it (Note
  // [Activation recomputation] in models/model.h); a model must agree.
  const std::vector<bool>& recomputed() const;
  const Optimizer& optimizer() const;
  int shard_rank() const;  // this rank's index in its shard group
  // Measured bytes of the engine's own buffers (the plan's categories).
  MemStats memory() const;
  MemoryPlan plan() const;

  // One optimizer step: micro_batches forward and backward passes of
  // `model` on this rank, then the update. Collective.
  StepResult step(Model& model);

  // Note [Driving the engine]: the step's parts, for a host that runs its
  // own passes. Collective where they issue collectives (unshard, reduce,
  // finish_step): every rank calls them for the same units in the same order.
  enum class Pass { kForward, kBackward };
  Stream& compute();
  // Blocks until the work enqueued on compute() so far has run, at most the
  // world's timeout: a collective it waits for that does not complete is
  // named with the ranks that did not arrive (CommError).
  void wait_compute();
  Tensor unshard(int unit, Pass pass);
  void reshard(int unit);
  // Whether the unit is unsharded (unshard called, reshard not yet).
  bool unsharded(int unit) const;
  Tensor gradient_buffer(int unit);
  void reduce_gradients(int unit);
  void note_loss(double loss);
  StepResult finish_step();
  // The lr of the steps from the next on, in place of the config's schedule
  // (Optimizer::set_lr). Between steps, the same on every rank.
  void set_lr(double lr);
  // The factor the next step's gradients carry where a host scales its loss
  // (precision.loss_scaling; 1 without): what GradScaler.scale multiplies by.
  // The gradients handed over are unscaled (divided by it) first.
  double loss_scale() const;
  // The mean loss of `count` forward-only passes per rank over the current
  // weights: rank r runs micro-batches first + j * world + r, j < count
  // (so the ranks read disjoint data), and the losses are summed in the
  // order of that index, as step() sums them. Changes no weights, moments
  // or step count. Collective; count >= 1.
  double evaluate(Model& model, int64_t first, int count);

  // This rank's shard of unit u's weights as fp32 (shard_numel elements,
  // padding included): the fp32 master, the exact bf16 + remainder master,
  // or the params themselves when there is no master.
  std::vector<float> master_shard(int unit) const;
  // The unit's full weights as fp32 (unpadded), gathered over the shard group.
  // Collective.
  std::vector<float> gather_master(int unit);
  // Replaces unit `unit`'s weights with `full` (the unit's numel values, as
  // gather_master returns them; alignment gaps should be 0): each rank
  // keeps its shard, cast as the policy stores weights. Optimizer state and
  // step counts are untouched. Call between steps, on every rank with the
  // same values.
  void set_weights(int unit, std::span<const float> full);

  // This rank's shards of weights and optimizer state, the optimizer's
  // counters and the step count, to read and write between steps
  // (runtime/shard_state.h): what checkpoints save and load.
  ShardStateView shard_state();

  class Impl;  // internal: runtime/engine_impl.h

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mp

// runtime/unit_state.h: what this rank keeps of one flat unit (Note [Unit
// state]). Internal to the engine.
//
// Note [Unit state]
// A unit of the layout (models/flat_layout.h) has `full` padded elements,
// split into shard_size shards of n; this rank's shard is [offset, offset + n).
// Its buffers, in the dtypes of the precision policy (runtime/precision.h):
//   weights    master: fp32 [n]                          (master kFp32)
//              param_shard: param dtype [n], persistent  (when the update
//                writes it; with kBf16Remainder it is the bf16 half and
//                remainder the int16 rest, together the fp32 value exactly)
//   moments    state0, state1: state dtype               (state_count of them)
//              state0 [n]; state1 [state1_numel]: AdamW's second moment is
//              kept only where the fused update runs (compact_state1 in
//              optim/optimizer.h): n unless Muon's matrices are skipped
//   gradients  grad_shard [n]: the reduced gradient the update reads
//              acc_full [full]: grad_accum dtype, summed over micro-batches
//                (NO_SHARD, SHARD_OPTIMIZER, UNSHARDED accumulation)
//              acc64 [n]: fp64 sums of the deterministic reduction
//   gathered   full_params [full]: param dtype (SHARD_OPTIMIZER, SHARD_GRAD_OP)
//   ranges     the optimizer's parameter groups over [0, n), kept on the
//              host and, for the fused update, in the engine's device memory
// Invariants:
// - Every buffer is allocated once, here, through the engine's allocator,
//   and never replaced (the memory plan counts exactly these); a buffer is
//   defined iff the options keep it. Only their contents change.
// - NO_SHARD (not deterministic): grad_shard is acc_full, one buffer.
// - reduced() is recorded on the stream of the unit's last reduction of the
//   step (with optimizer_in_backward, after its update there); the grad
//   shard is final, and may be read by work ordered after it.
// - The buffers are the engine's device memory: the host reads and writes
//   them only through copies in stream order (Note [Host staging] in
//   runtime/host_staging.h).
#pragma once

#include <vector>

#include "core/allocator.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "kernels/update_args.h"
#include "models/flat_layout.h"
#include "optim/optimizer.h"
#include "runtime/engine_options.h"
#include "runtime/shard_field.h"

namespace mp {


class UnitState {
 public:
  // Allocates the buffers of unit `index` for this rank (shard_rank in its
  // shard group); the weights are zero until set_weights.
  // The range table is copied to the device on `s` (the engine waits for
  // `s` before the first step).
  UnitState(int index, const UnitLayout& layout, int shard_rank, const EngineOptions& o, const Optimizer& opt,
            Allocator& alloc, Stream& s);
  UnitState(UnitState&&) = default;

  int64_t n() const { return n_; }
  int64_t full() const { return full_; }
  int64_t offset() const { return offset_; }

  // The shard's weights (n values) written as the policy keeps them:
  // master, bf16 + remainder, or the params themselves; staged through the
  // host and copied in order on `s`, then waited for.
  void set_weights(const std::vector<float>& values, Stream& s);
  // The shard's weights as fp32 (n values, padding included), copied to the
  // host in order on `s` and waited for.
  std::vector<float> weights(Stream& s) const;

  const Tensor& master() const { return master_; }
  const Tensor& param_shard() const { return param_shard_; }
  const Tensor& grad_shard() const { return grad_shard_; }
  const Tensor& acc_full() const { return acc_full_; }
  double* acc64() const { return static_cast<double*>(acc64_.data()); }
  const Tensor& full_params() const { return full_params_; }

  // What the fused update of this shard reads and writes.
  UpdateArgs update_args(const EngineOptions& o) const;
  // The stored fields (Note [Checkpoint format]), in checkpoint order:
  // each n elements as checkpoints see it.
  std::vector<ShardField> fields() const;
  // Where elements [begin, begin + count) of fields()[field] are: pieces
  // of the request in order (ShardFieldPiece). One piece for every field
  // but a compact state1.
  std::vector<ShardFieldPiece> field_pieces(int field, int64_t begin, int64_t count) const;

  const Event& reduced() const { return reduced_; }
  void set_reduced(Event e) { reduced_ = std::move(e); }

 private:
  int index_ = 0;
  MasterMode master_mode_ = MasterMode::kFp32;
  int64_t n_ = 0, full_ = 0, offset_ = 0;
  Tensor master_;
  Buffer remainder_;  // int16 [n]
  Tensor param_shard_;
  Tensor state0_, state1_;
  int64_t state1_numel_ = 0;
  Tensor acc_full_;
  Tensor grad_shard_;
  Buffer acc64_;      // double [n]
  Tensor full_params_;
  std::vector<UpdateRange> ranges_;
  Buffer ranges_device_;  // ranges_ in the engine's device memory
  Event reduced_;
};

}  // namespace mp

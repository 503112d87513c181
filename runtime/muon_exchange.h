// runtime/muon_exchange.h: optimizer kind MUON in the sharded engine: each
// Muon matrix whole on one rank of the shard group. Internal to the engine.
//
// Note [Muon in the engine]
// The Muon matrices are the parameters the model spec marks (ParamSpec::
// muon; the GPT's blocks' 2-D weights). The fused update leaves their
// elements alone (UpdateRange::skip) and runs the optimizer's AdamW, at
// Optimizer::element_lr, on the rest. Muon's momentum is element-wise, so it
// stays sharded like every other optimizer state: in the first moment's
// slot (state0) of the matrices' elements, saved, loaded and resharded by
// checkpoints as state0 is. Only Newton-Schulz needs a matrix whole: each
// has one owner in the shard group (Note [Muon owners] in optim/muon.h).
// After the gradients are reduced and the step's decision is taken (a
// skipped step changes nothing, momentum included), on the compute stream:
//   1. per unit, after its AdamW part, every rank updates the momentum of
//      its shard's Muon elements and forms U there (muon_momentum_element),
//      as fp32, into its send buffer: unit by unit, the pieces for owner 0,
//      then owner 1, ... (MuonPiece, fixed by the layout);
//   2. per unit, an all-to-all of uneven chunks (all_to_all_v) over the
//      shard group brings every owner its pieces, in rank order; every
//      unit's is issued back to back;
//   3. each owner assembles its matrices' U and computes O = NS(U)
//      (ops::newton_schulz, muon_ns_options), all of them in a row, and writes O's
//      slices where U's pieces were;
//   4. per unit, the all-to-all back brings every rank O for its pieces,
//      where U's were in its send buffer;
//   5. every rank applies the element part to its master slices
//      (muon_apply_element: decay, then the fma of O at -adjusted_lr) and
//      writes its parameter copies, as the fused update does for the rest.
// The iterations wait for every unit's exchange, not each for its own:
// owners are balanced over the whole model's flops, and a unit has few
// matrices (the GPT's four), so unit by unit most ranks would wait for the
// one owning its largest matrix. The buffers hold the rank's Muon elements
// (send) and its matrices' (receive), fp32, with no padding; a group of one
// has the send buffer only.
// The gradient seen by Muon is the reduced one times the StepPlan's
// multiplier, computed as the fused update does, and NS runs on the whole
// matrix, so the result does not depend on the strategy, the world size or
// the owner: with deterministic reductions every layout gives the same bits
// as one rank. NO_SHARD (a shard group of one) keeps every matrix on every
// rank, each its own owner. AdamW's second moment (state1) is not kept for
// Muon's elements (compact_state1 in optim/optimizer.h; checkpoints see
// zeros there). Every part is an op on a stream
// (kernels/ops.h: muon_momentum, newton_schulz, muon_apply, copy_bytes), so
// the exchange runs on CPU and CUDA devices alike.
//
// Note [Muon overlapped]
// With sharding.optimizer_in_backward the step is decided before the
// backward (no clipping, no loss scaling), so Muon need not wait for it:
// when unit u's reduction lands, its AdamW part and step 1 run on the
// reduction's stream, u's all-to-all follows on the communication stream,
// and the owner's iterations for u run on the exchange's own stream while
// the compute stream goes on with the backward of the units before u. The
// communication stream never waits for the iterations during the backward
// (the gathers and reductions of the next units queue there). After the
// backward the compute stream waits for the iterations, then the
// exchanges back go out and step 5 runs as above; only then are the Muon
// units' next gathers issued. Same functions on the same data: the bits
// equal the step after the backward.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "optim/muon.h"
#include "runtime/matrix_step.h"
#include "runtime/muon_plan.h"

namespace mp {

// MatrixStep::begin is step 1 of Note [Muon in the engine] for unit u
// (with optimizer_in_backward also its steps 2 and 3, Note [Muon
// overlapped]); finish() is steps 2 to 5 for every unit (then only 4 and 5).
class MuonExchange : public MatrixStep {
 public:
  MuonExchange(const FlatLayout& layout, const EngineOptions& o, const MuonSettings& settings, Communicator& shard,
               CommWatch& comm, Allocator& alloc);

  bool has(int unit) const override { return !units_[static_cast<size_t>(unit)].pieces.empty(); }
  void begin(int u, const UnitState& unit, float grad_multiplier, Stream& stream) override;
  void finish(const std::vector<UnitState>& units, double lr, Stream& compute) override;

 private:
  struct Unit {
    std::vector<MuonPiece> pieces;         // every rank's
    std::vector<int64_t> send_counts;      // to each owner
    std::vector<int64_t> recv_counts;      // from each rank, as owner
    int64_t send_base = 0, recv_base = 0;  // where the unit starts in send_, recv_
  };
  WorkPtr exchange(int u, bool back, const Event& ready);
  void orthogonalize(int u, Stream& stream);
  void apply(int u, const UnitState& unit, double lr, Stream& stream);
  void receive_and_apply(const std::vector<UnitState>& units, double lr, Stream& compute, const Event& ready);

  const EngineOptions& o_;
  const MuonSettings& settings_;
  Communicator& shard_;
  CommWatch& comm_;
  Device device_;
  int rank_ = 0, size_ = 1;
  std::vector<MuonMatrixInfo> matrices_;
  std::vector<int> owned_;      // the matrices this rank owns
  std::vector<Unit> units_;
  Tensor send_;                 // this rank's pieces: U out, O back in
  Tensor recv_;                 // the pieces of its matrices: U in, O out (a group of one: send_)
  Tensor u_, o_mat_, scratch_;
  std::unique_ptr<Stream> ns_;  // the iterations' (optimizer_in_backward)
};

}  // namespace mp

// runtime/muon_exchange.h: optimizer kind MUON in the sharded engine: each
// Muon matrix whole on one rank of the shard group. Internal to the engine.
//
// Note [Muon in the engine]
// The Muon matrices are the parameters the model spec marks (ParamSpec::
// muon; the GPT's blocks' 2-D weights). The fused update leaves their
// elements alone (UpdateRange::skip) and runs the optimizer's AdamW, at
// Optimizer::adamw_lr, on the rest. Muon's momentum is element-wise, so it
// stays sharded like every other optimizer state: in the first moment's
// slot (state0) of the matrices' elements, saved, loaded and resharded by
// checkpoints as state0 is. Only Newton-Schulz needs a matrix whole: each
// has one owner in the shard group (Note [Muon owners] in optim/muon.h).
// After the gradients are reduced and the step's decision is taken (a
// skipped step changes nothing, momentum included), on the compute stream:
//   1. per unit, after its AdamW part, every rank updates the momentum of
//      its shard's Muon elements and forms U there (muon_momentum_element),
//      as fp32, into one block per owner (each piece at a fixed slot from
//      the layout; the blocks hold every unit's pieces, padded to the
//      largest);
//   2. one all-to-all over the shard group brings every owner its blocks;
//   3. each owner assembles its matrices' U and computes O = NS(U)
//      (muon_orthogonalize_cpu), one after another, then writes O's slices
//      into the same slots of its blocks to each rank;
//   4. a second all-to-all brings every rank O for its slices;
//   5. every rank applies the element part to its master slices
//      (muon_apply_element: decay, then the fma of O at -adjusted_lr) and
//      writes its parameter copies, as the fused update does for the rest.
// One exchange for all units, not one per unit: owners are balanced over
// the whole model's flops, and a unit has few matrices (the GPT's four), so
// per unit most ranks would wait for the one owning its largest matrix.
// The cost is memory: the blocks hold the shard's Muon elements, twice.
// The gradient seen by Muon is the reduced one times the StepPlan's
// multiplier, computed as the fused update does, and NS runs on the whole
// matrix, so the result does not depend on the strategy, the world size or
// the owner: with deterministic reductions every layout gives the same bits
// as one rank. NO_SHARD (a shard group of one) keeps every matrix on every
// rank, each its own owner. The AdamW second moment (state1) of Muon's
// elements is allocated and unused. Host tasks on the compute stream: CPU
// devices only for now.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/allocator.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "models/flat_layout.h"
#include "optim/muon.h"
#include "runtime/comm_watch.h"
#include "runtime/engine_options.h"
#include "runtime/unit_state.h"

namespace mp {

struct MuonMatrixInfo {
  std::string name;
  int unit = 0;
  int64_t offset = 0;          // in the unit's flat buffer
  int64_t rows = 0, cols = 0;
  int64_t lr_a = 0, lr_b = 0;  // adjust_lr_fn's shape
  double flops = 0;            // muon_ns_flops
  int owner = 0;               // in the shard group
};

// The Muon matrices of a layout (ParamSpec::muon) and their owners in a
// shard group of `shard_size`. ConfigError for a marked parameter that is
// not 2-D.
std::vector<MuonMatrixInfo> muon_matrices(const FlatLayout& layout, const MuonHyper& hyper, int shard_size);

// Which parameters Muon takes (the model's marks: their count, elements and
// the first names) and, one line per rank of the shard group, the matrices
// it owns and its share of the Newton-Schulz flops: the run log and --plan.
std::string describe_muon_owners(const std::vector<MuonMatrixInfo>& matrices, int shard_size);

// The bytes the exchange allocates on each rank of the shard group, all
// MemCategory::kCommScratch, for the memory plan: the two exchange buffers,
// its largest owned matrix's U and O, and that matrix's Newton-Schulz
// scratch. [shard rank].
std::vector<int64_t> muon_scratch_bytes(const FlatLayout& layout, const MuonHyper& hyper, int shard_size);

class MuonExchange {
 public:
  MuonExchange(const FlatLayout& layout, const EngineOptions& o, const MuonSettings& settings, Communicator& shard,
               CommWatch& comm, Allocator& alloc);

  const std::vector<MuonMatrixInfo>& matrices() const { return matrices_; }
  bool has(int unit) const { return !units_[static_cast<size_t>(unit)].pieces.empty(); }
  // Enqueues step 1 of Note [Muon in the engine] for unit u on `compute`,
  // which must already be ordered after u's reduced gradients: the momentum
  // of this rank's Muon elements and their U, into the owners' blocks.
  void begin(int u, const UnitState& unit, float grad_multiplier, Stream& compute);
  // Enqueues steps 2 to 5 for every unit with Muon matrices, once each has
  // begun this step: one all-to-all there and one back for all of them, so
  // each owner runs all its matrices in a row and no rank waits for another
  // between units (owners balance the flops of the whole model, not of a
  // unit). `units`: the engine's, by index.
  void finish(const std::vector<UnitState>& units, double lr, Stream& compute);

 private:
  struct Piece {
    int matrix = 0;
    int rank = 0;        // the shard rank holding it
    int64_t begin = 0;   // in the unit's flat buffer
    int64_t end = 0;
    int64_t slot = 0;    // in the block between rank and the matrix's owner
  };
  struct Unit {
    std::vector<Piece> pieces;
  };
  void exchange(Stream& compute);

  const EngineOptions& o_;
  const MuonSettings& settings_;
  Communicator& shard_;
  CommWatch& comm_;
  int rank_ = 0, size_ = 1;
  std::vector<MuonMatrixInfo> matrices_;
  std::vector<int> owned_;      // the matrices this rank owns
  std::vector<Unit> units_;
  int64_t block_ = 0;           // elements per block of the all-to-alls
  Tensor send_, recv_, u_, o_mat_, scratch_;
};

}  // namespace mp

// runtime/matrix_step.h: the engine's side of an optimizer kind that
// updates whole matrices (Note [Optimizer kinds] in optim/optimizer_kind.h;
// Muon's: runtime/muon_exchange.h). Internal to the engine. The fused
// update runs the kind's rule on every other element (UpdateRange::skip).
// In a step that is not skipped the engine calls begin(u) for every unit
// after its fused update, on the same stream (with optimizer_in_backward:
// as its reduction lands), then finish() on the compute stream, and only
// then issues the next gathers of the units that have matrix elements.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/allocator.h"
#include "core/stream.h"
#include "models/flat_layout.h"
#include "optim/optimizer.h"
#include "runtime/comm_watch.h"
#include "runtime/engine_options.h"
#include "runtime/unit_state.h"

namespace mp {

class MatrixStep {
 public:
  virtual ~MatrixStep() = default;
  virtual bool has(int u) const = 0;  // unit u holds elements of the matrices
  // Unit u's part, on `stream`, after its reduced gradients (grad_multiplier: the StepPlan's).
  virtual void begin(int u, const UnitState& unit, float grad_multiplier, Stream& stream) = 0;
  // The rest, for every unit (the engine's, by index), at the scheduled lr.
  virtual void finish(const std::vector<UnitState>& units, double lr, Stream& compute) = 0;
};

// The step of `opt`'s kind on the shard group `shard`; null for a kind
// without whole matrices.
std::unique_ptr<MatrixStep> make_matrix_step(const FlatLayout& layout, const EngineOptions& o, const Optimizer& opt,
                                             Communicator& shard, CommWatch& comm, Allocator& alloc);

}  // namespace mp

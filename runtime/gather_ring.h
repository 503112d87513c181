// runtime/gather_ring.h: the ring of all-gather buffers that FULL_SHARD and
// HYBRID_SHARD compute from (Note [Engine schedule] in runtime/engine.h).
// Internal to the engine.
//
// Note [Gather ring]
// min(k + 1 + h, units) shared slots, k = sharding.prefetch_depth, h =
// sharding.held_units (units a driving host holds), each a param-dtype
// buffer of the largest padded unit that is not oversized, and a slot of
// its own for each oversized unit (Note [Oversized units] in
// models/flat_layout.h), which no other unit takes. acquire(u, direction)
// returns unit u's full parameters, first making sure that u and its next k
// units in `direction` (+1 forward, -1 backward) are in slots, issuing the
// missing gathers in order of use (u first; in the backward, units whose
// backward reads no parameters are skipped), and orders the compute stream
// after u's gather. A missing unit takes the least recently used slot among
// those holding no unit wanted now. release(u, e) notes the event after the
// compute that read u's slot.
// Invariants:
// - A slot holds at most one unit and a unit is in at most one slot; a
//   slot's contents are the unit's current weights (drop() empties every
//   slot when the weights change).
// - Compute reads a slot only after its gather (the compute stream waits for
//   the gather's event); a gather into a slot starts only after the compute
//   that read its previous contents (the communication stream waits for the
//   slot's release event). Gathers into one slot follow each other in the
//   communication stream's order, so none is waited for on the host.
// - Since the wanted units (at most k + 1) never exceed the slots, a free
//   slot always exists, and a unit stays gathered until its slot is reused:
//   the last k + 1 units of the forward are not gathered again for the
//   backward.
// - Every rank calls acquire, drop and prefetch_into with the same units in
//   the same order, so the gathers (collectives) are issued alike.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "models/flat_layout.h"
#include "runtime/comm_watch.h"

namespace mp {

class GatherRing {
 public:
  // Issues unit u's all-gather into `dst` (its padded elements) and returns it.
  using Issue = std::function<WorkPtr(int unit, const Tensor& dst)>;

  GatherRing(const FlatLayout& layout, int slots, int prefetch_depth, DType dtype, Allocator& alloc, CommWatch& comm,
             Stream& comm_stream, Issue issue);

  int size() const { return static_cast<int>(slots_.size()); }
  Tensor acquire(int u, int direction, Stream& compute);
  // The gathers of u and its next k units in `direction` that are missing,
  // as far as free slots go; orders nothing.
  void prefetch(int u, int direction);
  // `readers_done`: recorded on the compute stream after the work that read
  // unit u's parameters.
  void release(int u, Event readers_done);
  // Empties every slot (their contents are stale).
  void drop();
  // After drop(): gathers unit u (< size()) into a free slot, so that the
  // next forward finds its first units there (as far as slots go).
  void prefetch_into(int u);

 private:
  struct Slot {
    Tensor buffer;  // param dtype [max padded]
    int unit = -1;
    uint64_t last_use = 0;
    WorkPtr work;   // the gather into buffer, until compute was ordered after it
    Event released; // the compute that read the buffer's previous contents
    bool held = false;  // acquired, not released yet
    int owner = -1;     // the oversized unit whose own slot this is; -1: shared
  };

  void issue(int u, Slot& slot);
  Slot* find(int u);
  // For unit u: its own slot (oversized), else the least recently used
  // shared slot that holds no unit of `wanted`; null if none is free.
  Slot* free_slot(int u, const std::vector<int>& wanted);
  std::vector<int> window(int u, int direction) const;
  // Issues the missing gathers of `wanted` in order; false when unit
  // wanted[0] itself found no free slot.
  bool issue_missing(const std::vector<int>& wanted);

  const FlatLayout& layout_;
  std::vector<Slot> slots_;
  int prefetch_depth_ = 0;
  CommWatch& comm_;
  Stream& comm_stream_;
  Issue issue_;
  uint64_t tick_ = 0;
};

}  // namespace mp

// runtime/param_gathers.h: where the model's compute gets a unit's full
// parameters, for every strategy. Internal to the engine.
//
// Note [Param gathers]
// - FULL_SHARD, HYBRID_SHARD over more than one rank: the gather ring
//   (runtime/gather_ring.h). Before the update the ring is dropped (its
//   copies are stale then); during it the next step's first units are
//   gathered into it, overlapping the remaining updates.
// - SHARD_OPTIMIZER, SHARD_GRAD_OP over more than one rank: every unit's
//   full_params stay gathered. After a unit's update it is gathered again at
//   once (prefetch_depth > 0: overlapping the remaining updates; with
//   optimizer_in_backward after the update's stream), or marked stale and
//   gathered when next needed (prefetch_depth 0).
// - One rank per shard group: the shard is the unit. Params in param dtype
//   are read in place; CAST_AT_GATHER casts the master into a staging
//   buffer on the compute stream: one, plus one per held unit
//   (sharding.held_units); a buffer is reused once its unit is released.
// Ordering (Note [Engine events] in runtime/engine.h): the compute stream
// waits for a unit's gather before reading it; a gather waits on the
// communication stream for the compute that last read its destination
// (released) and for the unit's update (updated).
// The all-gather's source is this rank's shard in param dtype: the
// persistent param shard, the fp32 master (fp32 params), or, CAST_AT_GATHER,
// the master cast into the staging buffer on the communication thread just
// before the gather. Every cast outside the update counts in cast_elements().
#pragma once

#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "core/stream.h"
#include "runtime/comm_watch.h"
#include "runtime/gather_ring.h"
#include "runtime/unit_state.h"

namespace mp {


class ParamGathers {
 public:
  ParamGathers(const EngineOptions& o, const FlatLayout& layout, std::vector<UnitState>& units, Communicator& shard,
               Stream& shard_stream, CommWatch& comm, Allocator& alloc);
  ParamGathers(const ParamGathers&) = delete;
  ParamGathers& operator=(const ParamGathers&) = delete;

  // Unit u's full parameters for compute, which work on `compute` may read
  // from now on; direction +1 forward, -1 backward (which neighbours to
  // prefetch).
  Tensor params_for(int u, int direction, Stream& compute);
  // The gathers params_for(u, direction) would issue, issued now (the gather
  // ring's; nothing elsewhere): a host driving the engine calls it for the
  // unit whose backward comes next before issuing a reduction, so that the
  // gather the compute waits for first goes first.
  void prefetch(int u, int direction);
  // `readers_done`: recorded on the compute stream after the work that read
  // what params_for(u) returned.
  void release(int u, Event readers_done);

  // Unit u's weights were updated by the work before `update_done`.
  // Re-gathers or marks stale its full params.
  void updated(int u, Event update_done);
  // Before the step's updates: the ring's copies are stale.
  void drop_ring();
  // During the updates, after unit u's (updated() was called): the next
  // step's unit u into the ring.
  void prefetch_next_step(int u);
  // After the weights were replaced between steps (a checkpoint load,
  // set_weights), or first set: drops gathered copies of the old weights and
  // gathers again where the strategy keeps full params. Collective.
  void replaced();

  // Whether every unit's params_for() stays in place and unchanged until
  // the step's updates (Model::set_params_persist): full parameters kept,
  // or one rank per shard group reading its shard in param dtype.
  bool persistent() const;

  int64_t cast_elements() const { return cast_elements_; }

 private:
  Tensor gather_source(int u);
  WorkPtr issue_gather(int u, const Tensor& dst);
  WorkPtr issue_int8_gather(int u, const Tensor& dst);  // sharding.int8_param_gather
  void issue_full_gather(int u);

  struct FullCopy {        // SHARD_OPTIMIZER, SHARD_GRAD_OP: units[u].full_params
    WorkPtr gather;        // the all-gather into it, until compute was ordered after it
    bool stale = false;    // updated, not gathered yet (prefetch_depth 0: on demand)
    Event released;        // the compute that last read it
  };

  const EngineOptions& o_;
  std::vector<UnitState>& units_;
  Communicator& shard_;
  Stream& shard_stream_;
  CommWatch& comm_;
  GatherRing ring_;        // no slots unless the strategy gathers per unit
  Tensor cast_staging_;    // param dtype (CAST_AT_GATHER), cast_staging_slots() buffers on one rank
  struct Staged {          // one rank, CAST_AT_GATHER: a staging buffer's unit
    int unit = -1;
    bool held = false;     // acquired, not released yet
    uint64_t last_use = 0;
  };
  std::vector<Staged> staged_;
  uint64_t tick_ = 0;
  Tensor stage(int u, Stream& compute);
  static constexpr DType kByteCarrier = DType::kF8E4M3;  // raw bytes travel as a 1-byte dtype
  Tensor int8_send_, int8_recv_, int8_f32_;  // int8_param_gather: this shard and all, quantized; fp32 staging
  std::vector<FullCopy> full_;
  std::vector<Event> updated_;  // per unit: its latest update
  int64_t cast_elements_ = 0;
};

}  // namespace mp

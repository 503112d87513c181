// runtime/engine_impl.h: the engine's state, shared by engine.cc (set-up,
// gathers, the step) and engine_reduce.cc (gradient reductions). Internal.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <vector>

#include "comm/mesh.h"
#include "runtime/engine.h"

namespace mp {

struct EngineUnit {
  int64_t n = 0;        // shard elements
  int64_t full = 0;     // padded unit elements
  int64_t offset = 0;   // this rank's shard starts here in the unit
  Tensor master;        // fp32 [n] (master kFp32)
  Buffer remainder;     // int16 [n] (master kBf16Remainder)
  Tensor param_shard;   // param dtype [n], persistent
  Tensor state0, state1;
  Tensor acc_full;      // grad_accum dtype [full]
  Tensor grad_shard;    // grad_shard dtype [n] (NO_SHARD: acc_full)
  Buffer acc64;         // double [n] (deterministic)
  Tensor full_params;   // param dtype [full] (SHARD_OPTIMIZER, SHARD_GRAD_OP)
  std::vector<UpdateRange> ranges;
  Event reduced;        // this step's reductions of the unit have landed
  WorkPtr full_gather;  // pending all-gather into full_params
  bool full_stale = false;  // updated, not yet gathered (prefetch_depth 0: on demand)
  double ib_sum_sq = 0; // optimizer in backward: statistics taken before the update
  bool ib_non_finite = false;
};

struct GatherSlot {
  Tensor buffer;  // param dtype [max padded]
  int unit = -1;
  uint64_t last_use = 0;
  WorkPtr work;
};

class Engine::Impl {
 public:
  using Clock = std::chrono::steady_clock;

  Impl(const ModelSpec& spec, const proto::EngineConfig& config, Communicator& world, Allocator allocator);

  // engine.cc
  void init_params();
  // Writes this rank's shard of unit u's weights (unit.n values) into the
  // master, remainder and param shard as the policy keeps them.
  void set_shard_weights(int u, const std::vector<float>& values);
  // After the weights or state were replaced between steps (a checkpoint
  // load, set_weights): drops gathered copies of the old weights and
  // gathers again where the strategy keeps full params.
  void state_replaced();
  Tensor params_for(int u, int direction);
  void issue_gather(int u, GatherSlot& slot);
  void issue_full_gather(int u);
  Tensor gather_source(int u);
  void update_unit(int u, const StepPlan& plan);
  StepResult step(Model& model);
  double evaluate(Model& model, int64_t first, int count);
  double mean_loss(const std::vector<double>& losses);
  std::vector<float> master_shard(int u) const;
  double loss_scale_now() const;
  void locate_non_finite(StepResult& result);

  // engine_reduce.cc
  Tensor take_grad_buffer(int u, int& index);
  void reduce_unit(int u, int micro_batch, int index);
  void reduce_deterministic(int u, int micro_batch, const Tensor& g, int index);
  void reduce_full_accumulator(int u, int micro_batch, const Tensor& g, int index);
  void reduce_sharded(int u, int micro_batch, const Tensor& g, int index);
  void after_reduction(int u, int micro_batch, CpuStream& stream);

  void wait(const WorkPtr& w);
  void wait(const Event& e);
  // Every collective the engine issues passes here: kept (while pending)
  // so that a wait on an event of the communication thread that times out
  // can name the collective that did not complete.
  void maybe_serialize(const WorkPtr& w) {
    if (!w) return;
    while (!recent_works.empty() && (recent_works.size() > 256 || recent_works.front()->is_completed())) {
      recent_works.pop_front();
    }
    recent_works.push_back(w);
    if (o.serialize_communication) wait(w);
  }
  std::deque<WorkPtr> recent_works;
  CpuStream& grad_stream();

  ModelSpec spec;
  EngineOptions o;
  FlatLayout layout;
  Allocator alloc;
  std::unique_ptr<Optimizer> opt;
  Communicator& world;
  MeshGroups mesh;
  CpuStream* shard_stream = nullptr;
  CpuStream* replicate_stream = nullptr;
  std::unique_ptr<CommHook> hook;
  std::vector<EngineUnit> units;
  std::vector<GatherSlot> slots;
  uint64_t tick = 0;
  Tensor grad_in[2];
  Event grad_free[2];
  int grad_next = 0;
  Tensor cast_staging;  // param dtype (cast at gather)
  Tensor wire;          // reduce dtype [max padded]
  Tensor rs_scratch;    // reduce_out dtype [max shard]
  Tensor recv;          // fp32 [max padded] (deterministic all-to-all)
  Tensor gathered;      // fp32 [R x max padded] (deterministic across replicas)
  Event replicate_done; // the last replicate-group use of recv
  int64_t steps_run = 0;
  int64_t consecutive_skips = 0;
  int first_bad_unit = -1;  // this step: the first unit whose local gradients were not finite
  StepTimings timings;
  int64_t cast_elements = 0;  // this step's param casts outside the update
  // Full accumulators hold the sum over micro-batches; where they are cast
  // for the reduction (wire dtype, loss scale) the cast also divides by the
  // number of micro-batches, so 16-bit wire values do not overflow.
  bool mean_at_cast = false;
  double grad_divisor() const;
  bool ib_planned = false;
  StepPlan ib_plan;
};

}  // namespace mp

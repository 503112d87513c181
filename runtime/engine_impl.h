// runtime/engine_impl.h: the engine's state and its owners. Internal.
//
// Engine::Impl runs the schedule (Note [Engine schedule] in engine.h; the
// step and its parts in engine.cc, evaluation and weights in and out between
// steps in engine_between_steps.cc) over parts that each own one concern:
//   set-up          options, layout, optimizer, communicators: fixed once
//                   constructed (the optimizer's counters and loss scaler
//                   change with each step's decision)
//   units_          per-unit buffers (runtime/unit_state.h)
//   comm_           every collective issued and waited for (comm_watch.h)
//   gathers_        full parameters for compute: the gather ring and the
//                   kept full params (param_gathers.h, gather_ring.h)
//   reducer_        the gradient path into the reduced shards (grad_reducer.h)
//   matrices_       an optimizer kind's whole matrices (matrix_step.h)
//   stats_, decision_  statistics and the step's plan (step_decision.h)
//   step counters   steps run, consecutive skips, the step's timings
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "core/pinned.h"
#include "runtime/comm_watch.h"
#include "runtime/engine.h"
#include "runtime/grad_reducer.h"
#include "runtime/matrix_step.h"
#include "runtime/param_gathers.h"
#include "runtime/step_decision.h"
#include "runtime/unit_state.h"

namespace mp {

class Engine::Impl {
 public:
  using Clock = std::chrono::steady_clock;
  using Pass = Engine::Pass;

  Impl(const ModelSpec& spec, const proto::EngineConfig& config, Communicator& world, Allocator allocator);

  StepResult step(Model& model);
  // Note [Driving the engine] (engine.h): the parts step() is made of.
  Tensor unshard(int u, Pass pass);
  void reshard(int u);
  bool unsharded(int u) const;
  Tensor gradient_buffer(int u);
  void reduce_gradients(int u);
  void note_loss(double loss);
  StepResult finish_step();
  void wait_compute() { comm_.wait(compute_->record()); }
  double evaluate(Model& model, int64_t first, int count);
  std::vector<float> master_shard(int u) const;
  std::vector<float> gather_master(int u);
  void set_weights(int u, std::span<const float> full);
  // After the weights or state were replaced between steps (a checkpoint
  // load, set_weights): drops gathered copies of the old weights and
  // gathers again where the strategy keeps full params. Collective.
  void state_replaced();
  // Lets issued collectives and tasks finish (before the buffers go).
  void synchronize();
  // Waits for every stream, each to its end, whatever failed (the destructor).
  void drain() noexcept;
  // Runs one engine call: first rethrows an earlier stream-task failure,
  // and a failure of the call's own device or stream work comes out with
  // failure_context() added (Engine's public calls go through here).
  template <class F>
  auto call(F&& f) -> decltype(f());

  const ModelSpec& spec() const { return spec_; }
  const EngineOptions& options() const { return o_; }
  const FlatLayout& layout() const { return layout_; }
  const std::vector<bool>& recomputed() const { return recomputed_; }
  Optimizer& optimizer() const { return *opt_; }
  Communicator& world() const { return world_; }
  // "rank R on DEVICE, step S; last collective issued: ..." for error reports.
  std::string failure_context() const;
  const MeshGroups& mesh() const { return mesh_; }
  const Allocator& allocator() const { return alloc_; }
  const UnitState& unit(int u) const { return units_.at(static_cast<size_t>(u)); }
  int64_t steps_run() const { return steps_run_; }
  Stream& compute() const { return *compute_; }
  void set_steps_run(int64_t steps) { steps_run_ = steps; }

 private:
  // The phases of step(), in order (engine.cc).
  void begin_step();
  void forward(Model& model);
  void backward(Model& model);
  void reshard(int u, Event readers_done);
  void hand_over(int u);
  // finish_step's order checks, agreed over the world (Note [Driving the
  // engine]); step() skips them, its order being its own.
  void check_finish();
  StepResult finish_step(bool checked);
  // Note [Activation recomputation]: ConfigError unless the model recomputes
  // exactly the units engine.activation_checkpointing picks.
  void check_recomputation(const Model& model) const;
  void reduce(int u, int micro_batch, const GradBuffer& grads, const Event& computed);
  void update_in_backward(int u, Stream& stream);
  GradStats reduced_statistics();
  StepResult note_decision(const StepPlan& plan);
  Event write_scalars(const StepPlan& plan);
  void update(const StepPlan& plan);
  void update_unit(int u, Stream& stream);
  StepResult finish_step(StepResult result, const StepPlan& plan, const GradStats& total);
  void stop_if_needed(const StepResult& result) const;
  double mean_loss(const double* losses, int count);
  // Waits for `done` on the compute stream; throws on every rank if any
  // rank's compute failed (Note [A failed step]). Collective over the world.
  void agree_on_compute(const std::string& what, const Event& done);
  // Rethrows the first failure of a task on any of the engine's streams
  // (Note [Stream and event semantics]).
  void rethrow_stream_failures() const;
  void init_params();
  template <class F>
  Event on_compute(F&& enqueue);

  // ---- set-up
  ModelSpec spec_;
  EngineOptions o_;
  FlatLayout layout_;
  std::vector<bool> recomputed_;    // per unit: activations recomputed before its backward
  Allocator alloc_;
  std::unique_ptr<Optimizer> opt_;
  Communicator& world_;
  MeshGroups mesh_;
  Device device_;                   // where the engine's memory and compute are
  Stream* shard_stream_ = nullptr;  // the communicators' streams
  Stream* replicate_stream_ = nullptr;
  Buffer scalars_device_;           // StepScalars, device memory

  // ---- step counters
  int64_t steps_run_ = 0;
  int64_t consecutive_skips_ = 0;
  StepTimings timings_;       // this step's; exposed_comm_s is comm_'s
  Clock::time_point step_start_;
  std::vector<std::pair<Event, Event>> compute_spans_;  // timed events around each model call
  Event stats_begin_, stats_end_, update_begin_, update_end_;  // timed, on the compute stream
  // The source of write_scalars' copy: pinned (core/pinned.h), rewritten
  // only once the last copy from it has run (scalars_copied_).
  PinnedBuffer scalars_host_;
  Event scalars_copied_;
  bool scalars_written_ = false;
  Event scalars_ready_;
  // This rank's micro-batch losses, one slot per micro-batch, written on
  // the compute stream (Model::loss_on) and read once it has passed them;
  // evaluate()'s likewise, grown to the largest count asked for.
  PinnedBuffer losses_;
  PinnedBuffer eval_losses_;
  int64_t casts_before_ = 0;  // gathers_' cast count when the step began

  // ---- the driven step's order (Note [Driving the engine])
  bool step_open_ = false;        // begun (its first gradient buffer or loss), not finished
  std::vector<int> reduced_;      // per unit: backwards handed over this step
  std::vector<char> unsharded_;   // per unit: unsharded, not resharded
  int taken_ = -1;                // the unit whose gradient buffer is out, not reduced yet
  GradBuffer taken_buffer_;
  int losses_noted_ = 0;
  std::string unit_name(int u) const;
  void check_unit(int u, const char* call) const;
  void open_step();

  // ---- state and its owners
  CommWatch comm_;
  std::vector<UnitState> units_;  // filled once, never resized: reducer_ and gathers_ refer to it
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<ParamGathers> gathers_;
  std::unique_ptr<MatrixStep> matrices_;  // a kind with whole matrices (runtime/matrix_step.h)
  GradStatistics stats_;
  StepDecision decision_;

  // Last: destroyed first, so queued work finishes before the buffers go.
  std::unique_ptr<Stream> compute_;
};

}  // namespace mp

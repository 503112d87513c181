// models/model.h: the compute the sharded engine schedules. A model is an
// ordered list of units (models/flat_layout.h); the engine gathers each
// unit's parameters before the model runs it and takes the gradients back.
//
// Contract, for one micro-batch, every call enqueuing its work on the
// engine's compute stream `s` (core/stream.h) and returning at once, on the
// host thread that steps the engine:
//   begin_micro_batch_on(g, s)    g: the micro-batch's global index in the
//                                 step's batch; the model loads its data
//   forward_on(u, params, s)      for u = 0 .. U-1, in order
//   loss_on(loss, s)              after the last forward: a stream-ordered
//                                 write of this micro-batch's mean loss to
//                                 *loss, host memory the engine owns (one
//                                 slot per micro-batch, pinned for a device:
//                                 core/pinned.h) and reads once s has passed
//   backward_on(u, params, grads, s)  for u = U-1 .. 0, in order
// `params` is the unit's flat buffer (FlatLayout: padded_numel elements, in
// the precision policy's param dtype, on the engine's device); a parameter
// sits at its ParamPlacement::offset; backward_on gets an undefined
// `params` for a unit whose UnitSpec::backward_reads_params is false (no
// gather is spent on it). `grads` is an fp32 buffer of the same
// layout: backward overwrites every parameter's range with d loss / d param
// of this micro-batch (not accumulated; the engine accumulates) and leaves
// the gaps alone. Both are valid until the work enqueued by the call has run
// on `s`: the engine orders their producers and later users by events on s
// (Note [Engine events] in runtime/engine.h). Where the engine says so
// (set_params_persist), every unit's `params` stay valid and unchanged
// longer: until the step's updates.
//
// Note [Host runs ahead]
// The host thread returns from each call long before the stream has run its
// work: on a GPU, and on the CPU too (the compute stream is a worker
// thread), by up to a whole step. So state a stream task reads must belong
// to the stream: a device buffer written by earlier work of the stream, or
// a value captured when the task was enqueued, never a member the host
// thread changes on the next call. Checks of call order run on the host,
// at enqueue time. A task that throws fails the stream with the op's name
// and the engine rethrows it at its next call (Note [Stream and event
// semantics] in core/stream.h). MP_ORDER_TORTURE=1 makes the compute stream
// lag far behind the host in the tests (Note [Order torture]).
// A model must be deterministic: the same parameters and micro-batch give
// the same bits on any rank.
//
// Note [Activation recomputation]
// With engine.activation_checkpointing, the engine picks units among those
// the spec marks UnitSpec::recomputable (recomputed_units in
// models/flat_layout.h); the model, built for the same policy, says so
// through recomputes(u), and the engine checks that they agree before a
// step. Such a unit's forward_on keeps only what its backward cannot
// recompute (its input; the GPT's blocks keep their residual stream input
// and put the rest in one scratch shared by every recomputed block). Just
// before backward_on(u) the engine calls recompute_on(u, params, s) with the
// parameters it gathered for the backward (FULL_SHARD gathers them anyway;
// the other strategies keep them), which must rebuild exactly the state the
// forward left, so the gradients are the bits they would have been: a
// deterministic model gets that for free. The unit's forward thus runs
// twice per micro-batch, about a third more compute for a block.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "kernels/op_profile.h"
#include "models/flat_layout.h"

namespace mp {

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelSpec& spec() const = 0;
  virtual void begin_micro_batch_on(int64_t global_index, Stream& s) = 0;
  virtual void forward_on(int unit, const Tensor& params, Stream& s) = 0;
  virtual void loss_on(double* loss, Stream& s) = 0;
  virtual void backward_on(int unit, const Tensor& params, const Tensor& grads, Stream& s) = 0;
  // Note [Activation recomputation]: whether forward_on keeps only unit u's
  // input, and the call that rebuilds the rest just before backward_on(u).
  virtual bool recomputes(int unit) const {
    (void)unit;
    return false;
  }
  virtual void recompute_on(int unit, const Tensor& params, Stream& s) {
    (void)params;
    (void)s;
    MP_THROW(EnforceError, "recompute_on(", unit, ") of a model that recomputes no unit");
  }
  // Before a step's (or an evaluation's) forwards, the engine says whether
  // every unit's `params` stay in place and unchanged from its forward_on
  // until the step's updates (strategies that keep full parameters, and one
  // rank per shard group reading its shard in place), or may be released
  // after the unit's call (a gather ring, a cast at the gather). With true a
  // model may read a unit's parameters in a later unit's call (the GPT's
  // tied head reads wte so), which it must otherwise copy. Default: ignored.
  virtual void set_params_persist(bool persist) { (void)persist; }
};

// A model computed by the host (CPU memory), such as an embedding host's
// (launch/c_api.cc): each call runs its host body below as a host task of
// the compute stream, on the stream's worker thread, in order, so the
// bodies only ever see state of the stream's order (Note [Host runs
// ahead]). The bodies may use every core; they run one at a time.
class HostModel : public Model {
 public:
  void begin_micro_batch_on(int64_t g, Stream& s) final {
    host_stream(s).host_task(
        [this, g] {
          ModelCallScope profiled;  // Note [Op profile]
          begin_micro_batch(g);
        },
        TaskName{"begin micro-batch"});
  }
  void forward_on(int unit, const Tensor& params, Stream& s) final {
    host_stream(s).host_task(
        [this, unit, params] {
          ModelCallScope profiled;
          forward(unit, params);
        },
        TaskName{"forward"});
  }
  void loss_on(double* loss, Stream& s) final {
    host_stream(s).host_task([this, loss] { *loss = this->loss(); }, TaskName{"loss"});
  }
  void backward_on(int unit, const Tensor& params, const Tensor& grads, Stream& s) final {
    host_stream(s).host_task(
        [this, unit, params, grads] {
          ModelCallScope profiled;
          backward(unit, params, grads);
        },
        TaskName{"backward"});
  }

  void recompute_on(int unit, const Tensor& params, Stream& s) final {
    host_stream(s).host_task(
        [this, unit, params] {
          ModelCallScope profiled;
          recompute(unit, params);
        },
        TaskName{"recompute"});
  }

  // The host bodies, also called directly by tests and tools.
  virtual void begin_micro_batch(int64_t global_index) = 0;
  virtual void forward(int unit, const Tensor& params) = 0;
  virtual double loss() const = 0;  // after the last forward of a micro-batch
  virtual void backward(int unit, const Tensor& params, const Tensor& grads) = 0;
  // A host model that recomputes (overrides recomputes()) rebuilds unit u's
  // state from the parameters here, just before backward(unit).
  virtual void recompute(int unit, const Tensor& params) {
    (void)params;
    MP_THROW(EnforceError, "recompute(", unit, ") of a host model that recomputes no unit");
  }

 private:
  // `s`, once it is a CPU stream: a host model cannot compute on device memory.
  static Stream& host_stream(Stream& s) {
    if (!s.device().is_cpu()) {
      MP_THROW(ConfigError, "this model computes on the host, but the engine runs on ", s.device(),
               ": use a CPU engine (compute.device: CPU) or a model with device kernels");
    }
    return s;
  }
};

}  // namespace mp

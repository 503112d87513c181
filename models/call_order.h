// models/call_order.h: the order of a model's calls within a micro-batch
// (models/model.h: begin, forward 0 .. U-1, loss, backward U-1 .. 0),
// checked on the host thread when a call is enqueued, never in a stream
// task (Note [Host runs ahead] in models/model.h). Each check throws
// EnforceError naming the model and the call.
#pragma once

#include <string>
#include <utility>

#include "core/error.h"

namespace mp {

class CallOrder {
 public:
  CallOrder(std::string model, int units) : model_(std::move(model)), units_(units) {}

  // A micro-batch is loaded: forwards start again from unit 0.
  void begin() {
    loaded_ = true;
    forwarded_ = 0;
    next_backward_ = -1;
    recomputed_ = -1;
  }
  // Checks that forward(unit) may be enqueued; forwarded() once it was.
  void check_forward(int unit) const {
    check(unit, "forward");
    MP_ENFORCE_EQ(unit, forwarded_, model_, "::forward runs units in order");
  }
  void forwarded() {
    if (++forwarded_ == units_) next_backward_ = units_ - 1;
  }
  // The loss, or anything else that needs the whole forward.
  void after_forward(const char* what) const {
    MP_ENFORCE(loaded_ && forwarded_ == units_, model_, "::", what, " before the forward of every unit");
  }
  // Checks that backward(unit) may be enqueued; backwarded() once it was.
  void check_backward(int unit) const {
    check(unit, "backward");
    MP_ENFORCE(next_backward_ >= 0, model_, "::backward before the forward of every unit (or after unit 0)");
    MP_ENFORCE_EQ(unit, next_backward_, model_, "::backward runs units in reverse order, once each");
  }
  void backwarded() {
    --next_backward_;
    recomputed_ = -1;
  }
  // recompute(unit) comes just before backward(unit) (Note [Activation
  // recomputation] in models/model.h); check_recomputed before a backward
  // that needs it.
  void check_recompute(int unit) const {
    check(unit, "recompute");
    MP_ENFORCE(next_backward_ >= 0 && unit == next_backward_, model_, "::recompute of unit ", unit,
               " must come just before its backward (the next backward is of unit ", next_backward_, ")");
  }
  void recomputed(int unit) { recomputed_ = unit; }
  void check_recomputed(int unit) const {
    MP_ENFORCE(recomputed_ == unit, model_, "::backward of unit ", unit,
               ", whose activations are recomputed, without recompute just before it");
  }
  bool loaded() const { return loaded_; }

 private:
  void check(int unit, const char* what) const {
    MP_ENFORCE(loaded_, model_, "::", what, " before begin_micro_batch");
    MP_ENFORCE(unit >= 0 && unit < units_, model_, "::", what, " of unit ", unit, " of ", units_);
  }

  std::string model_;
  int units_;
  bool loaded_ = false;
  int forwarded_ = 0;
  int next_backward_ = -1;
  int recomputed_ = -1;
};

}  // namespace mp

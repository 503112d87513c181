// models/model.h: the compute the sharded engine schedules. A model is an
// ordered list of units (models/flat_layout.h); the engine gathers each
// unit's parameters before the model runs it and takes the gradients back.
//
// Contract, for one micro-batch:
//   begin_micro_batch(g)          g: the micro-batch's global index in the
//                                 step's batch; the model loads its data
//   forward(u, params)            for u = 0 .. U-1, in order
//   loss()                        after the last forward: this micro-batch's
//                                 mean loss
//   backward(u, params, grads)    for u = U-1 .. 0, in order
// `params` is the unit's flat buffer (FlatLayout: padded_numel elements, in
// the precision policy's param dtype, on the engine's device); a parameter
// sits at its ParamPlacement::offset. `grads` is an fp32 buffer of the same
// layout: backward overwrites every parameter's range with d loss / d param
// of this micro-batch (not accumulated; the engine accumulates) and leaves
// the gaps alone. Both are valid only during the call.
// A model must be deterministic: the same parameters and micro-batch give
// the same bits on any rank.
#pragma once

#include <cstdint>

#include "models/flat_layout.h"
#include "core/tensor.h"

namespace mp {

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelSpec& spec() const = 0;
  virtual void begin_micro_batch(int64_t global_index) = 0;
  virtual void forward(int unit, const Tensor& params) = 0;
  virtual double loss() const = 0;
  virtual void backward(int unit, const Tensor& params, const Tensor& grads) = 0;
};

}  // namespace mp

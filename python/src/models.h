// python/src/models.h: a Python object as the model an Engine steps
// (models/model.h). The object has
//   begin_micro_batch(index)            optional: load micro-batch `index`
//   forward(unit, params[, stream])     params: the unit's gathered flat buffer
//   loss()                              the micro-batch's mean loss
//   backward(unit, params, grads[, stream])  write d loss / d param into grads
//   recompute(unit, params[, stream])   only where the engine recomputes a
//                                       unit (Unit(recomputable=True) and
//                                       engine.activation_checkpointing;
//                                       Engine.recomputes(unit)): the forward
//                                       kept only the unit's input, this
//                                       rebuilds the rest just before backward
// params and grads are DLPack arrays (python/src/arrays.h) valid until the
// call returns; grads is fp32 and has the layout of params (write each
// parameter's range; the gaps are ignored).
//
// Note [Python callbacks]
// - An engine on the CPU (PyHostModel): the calls run on the engine's
//   compute thread, a thread of mp's, one at a time and in order, each
//   holding the GIL while it runs; the thread that called Engine.step waits
//   with the GIL released. loss() returns a float.
// - An engine on a CUDA device (PyDeviceModel): the calls run on the thread
//   that called Engine.step, as the engine enqueues the micro-batch (the
//   host runs ahead of the device), with `stream`, the engine's compute
//   stream (a cudaStream_t as an int): the model enqueues its device work
//   on it (torch.cuda.ExternalStream), which orders it after the gathers
//   and before the reductions with no host sync. loss() returns a one-element
//   float64 array on the device (anything with __dlpack__), copied to the
//   host on the stream.
// - A call that raises fails the step on every rank (Note [A failed step]
//   in runtime/engine.h): as ModelError, with the call, the unit and the
//   Python traceback in the message. Later calls of that step are skipped.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <string>
#include <vector>

#include "models/flat_layout.h"
#include "models/model.h"

namespace mp::python {

// The model for an engine on `device`: a PyHostModel on the CPU, else a
// PyDeviceModel. Made and destroyed with the GIL held.
// recomputed: per unit, whether the engine recomputes it (recomputed_units).
std::unique_ptr<Model> make_python_model(nanobind::object model, const ModelSpec& spec, Device device,
                                         std::vector<bool> recomputed);

// Drops the Python objects a device model kept for the stream (loss arrays
// whose copies have run): call with the GIL held, after the step.
void release_kept(Model& model);

}  // namespace mp::python

// python/src/engine.h: mp.Engine, mp.Param, mp.Unit and mp.StepResult.
#pragma once

#include <nanobind/nanobind.h>

namespace mp::python {

void bind_engine(nanobind::module_& m);

}  // namespace mp::python

// python/src/errors.h: mp's error tiers (core/error.h) as Python exceptions.
// mp.Error (a RuntimeError) is the base; ConfigError, IoError, CommError,
// CudaError, OutOfMemoryError, NumericError, ModelError and EnforceError
// derive from it, one per C++ class. An mp::Error thrown under a binding
// arrives as its class with the C++ message (what(): "[rank R] file:line:
// message") and the attributes message, rank, file, line, agreed and tier.
#pragma once

#include <nanobind/nanobind.h>

namespace mp::python {

// Creates the exception classes in `m` and registers the translator.
void bind_errors(nanobind::module_& m);

}  // namespace mp::python

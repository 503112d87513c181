// python/src/arrays.h: mp's tensors as DLPack arrays, zero-copy. A view
// borrows the tensor's memory and owns nothing: it is valid while the
// tensor is (for a callback's arguments, until the callback returns).
// Python gets a nanobind.nb_ndarray (nanobind's array_api framework), which speaks __dlpack__ (torch.from_dlpack,
// numpy.from_dlpack) and, on the host, the buffer protocol (numpy.asarray;
// bfloat16 only through DLPack).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "core/tensor.h"

namespace mp::python {

// The 1-D view of `t` (its numel elements, its dtype: float32, bfloat16 or
// float16), on its device (host or CUDA), as a Python object; None for an
// undefined tensor.
nanobind::object view(const Tensor& t);

// "float32", "bfloat16", "float16", ... (mp's dtype_name).
const char* python_dtype_name(DType d);

}  // namespace mp::python

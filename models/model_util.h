// models/model_util.h: the unit parameters as fp32, for every built-in CPU
// model (the fixed-order loops they share are kernels/cpu/loops.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/convert.h"
#include "kernels/cpu/loops.h"
#include "models/flat_layout.h"

namespace mp {

// A unit's parameters as fp32: `params` itself when it is fp32, else its
// first layout.numel elements converted into `workspace` (fp32, at least
// that long). Throws EnforceError naming the unit for a wrong device, shape
// or dtype.
inline const float* unit_params_fp32(const UnitLayout& layout, const Tensor& params, const Tensor& workspace) {
  MP_ENFORCE(params.device().is_cpu() && params.shape().size() == 1 && params.numel() >= layout.numel,
             "parameters of unit ", layout.name, " (", layout.numel, " elements): got ", params.describe());
  if (params.dtype() == DType::kF32) return params.data_as<float>();
  MP_ENFORCE(params.dtype() == DType::kBF16 || params.dtype() == DType::kF16, "parameters of unit ", layout.name,
             " in ", dtype_name(params.dtype()), ": need fp32, bf16 or fp16");
  const Tensor ws = workspace.flat(0, layout.numel);
  convert(params.flat(0, layout.numel), ws);
  return ws.data_as<float>();
}

}  // namespace mp

// kernels/mlp_math.h: the MLP's per-element math, shared by the CPU loops
// (kernels/cpu/mlp_ops.cc) and the CUDA kernels (kernels/cuda/mlp_ops.cu).
#pragma once

#include "kernels/hd.h"

namespace mp::math {

// d loss / d z of y = tanh(z), from dy = d loss / d y and y itself.
template <class T>
MP_HD T tanh_backward(T dy, T y) {
  return dy * (T(1) - y * y);
}

}  // namespace mp::math

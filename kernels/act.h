// kernels/act.h: an activation tensor in device memory as the model's ops
// read and write it: fp32 values, or bf16 values stored as bf16 or as fp32
// (exactly; how a CPU whose GEMMs have no native bf16 keeps them: kernels/
// nn/cast.h, bf16_storage).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mp {

// `dtype` is the storage (kF32 or kBF16); bf16: the values are bf16 (always
// for kBF16). An op that writes an Act rounds to bf16 (nearest even) where
// it holds bf16 values; an op that reads one widens it exactly to fp32.
struct Act {
  void* data = nullptr;
  DType dtype = DType::kF32;
  bool bf16 = false;

  float* f32() const { return static_cast<float*>(data); }
  // The elements from element `offset` on.
  Act at(int64_t offset) const {
    return Act{static_cast<char*>(data) + offset * static_cast<int64_t>(dtype_size(dtype)), dtype, bf16};
  }
};

// An fp32 activation.
inline Act f32_act(float* values) { return Act{values, DType::kF32, false}; }

// bf16 (else fp32) values at `data` on a device whose bf16 values are
// stored as `storage`.
inline Act make_act(void* data, bool bf16, DType storage) {
  return Act{data, bf16 ? storage : DType::kF32, bf16};
}

}  // namespace mp

// kernels/nn/cast.h: the casts around a model's GEMMs, as ops on a stream
// (Note [Op dispatch] in kernels/dispatch.h): rounding GEMM inputs to bf16,
// and widening the parameters a model reads as fp32.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/act.h"
#include "kernels/dispatch.h"

namespace mp::nn {

// A GEMM input in device memory: fp32 values, or bf16 values stored as
// bf16_storage(device) (kBF16, or kF32 holding bf16 values exactly where
// the CPU's GEMM multiplies bf16 as fp32: gemm_bf16_storage()).
struct Operand {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};
inline Operand fp32(const float* values) { return Operand{values, DType::kF32}; }
inline Operand operand(const Act& a) { return Operand{a.data, a.dtype}; }

// How bf16 GEMM inputs are stored on `device`: kBF16 on a GPU; on the CPU
// gemm_bf16_storage() (kernels/cpu/gemm.h).
DType bf16_storage(Device device);

// out[i] := x[i] rounded to bf16 (nearest even), stored as `storage`;
// returns the operand that reads out.
Operand round_to_bf16(const OpContext& cx, const float* x, int64_t n, DType storage, void* out);

// dst := src, n values: widened exactly, rounded to bf16 where dst holds
// bf16 values, or copied.
void convert(const OpContext& cx, Act src, Act dst, int64_t n, const char* name);

// Elements [begin, end) of each range of `src` (1-D; fp32, bf16 or fp16)
// widened exactly into the same elements of `dst` (fp32); the rest of dst
// is left alone.
using Ranges = std::vector<std::pair<int64_t, int64_t>>;
void widen(const OpContext& cx, const Tensor& src, const Ranges& ranges, float* dst);

}  // namespace mp::nn

// kernels/cuda/muon_cuda.h: Muon's element passes on a CUDA device, the
// twins of the CPU loops behind ops::muon_momentum and ops::muon_apply
// (kernels/ops.h): the same element math (kernels/muon_math.h), compiled
// without FMA contraction, and the same bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/muon_math.h"

namespace mp {

// u[i] = muon_momentum_element(momentum[i], g), g = grad[i] widened to fp32
// (times multiplier unless it is 1). grad: fp32, bf16 or fp16. Device
// memory; asynchronous on `stream`.
void muon_momentum_cuda(const void* grad, DType grad_dtype, float* momentum, float* u, int64_t n, float multiplier,
                        const MuonMomentum& c, cudaStream_t stream);

// The master's elements p = muon_apply_element(p, o[i]): with `master`
// (fp32) non-null, p is master[i], and param_out (null: none) gets p in
// param_dtype, rounded to nearest; else p is the bf16 + remainder pair
// (param_out as bf16 bits, remainder), split again after. Device memory;
// asynchronous on `stream`.
void muon_apply_cuda(float* master, int16_t* remainder, void* param_out, DType param_dtype, const float* o,
                     int64_t n, const MuonApply& c, cudaStream_t stream);

}  // namespace mp

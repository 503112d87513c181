// kernels/cpu/reduce.h: CPU loops over kernels/reduce_math.h.
#pragma once

#include <cstdint>

#include "kernels/reduce_math.h"
#include "core/dtype.h"

namespace mp {

// out[i] = (chunk_0[i] (op) ... (op) chunk_{n-1}[i]) / divisor for i < count,
// chunk k at chunks + k * stride elements (dtype in), accumulated in fp64 in
// chunk order and rounded once into out (dtype out_dtype, which may be wider).
void accumulate_rank_chunks_cpu(const void* chunks, DType in, int n, int64_t stride, int64_t count,
                                void* out, DType out_dtype, math::ElementOp op, double divisor);

// inout[i] = inout[i] (op) in[i] for i < n in dtype t (fp32, bf16, fp16):
// the wire-dtype reduction step (MPI user ops call it).
void reduce_pair_cpu(const void* in, void* inout, int64_t n, DType t, math::ElementOp op);

}  // namespace mp

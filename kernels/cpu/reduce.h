// kernels/cpu/reduce.h: CPU loops over kernels/reduce_math.h.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/reduce_math.h"

namespace mp {

// out[i] = (chunk_0[i] (op) ... (op) chunk_{n-1}[i]) / divisor for i < count,
// chunk k at chunks + k * stride elements (dtype in), accumulated in fp64 in
// chunk order and rounded once into out (dtype out_dtype, which may be wider).
void accumulate_rank_chunks_cpu(const void* chunks, DType in, int n, int64_t stride, int64_t count,
                                void* out, DType out_dtype, math::ElementOp op, double divisor);

// The same over n pieces anywhere in memory: pieces[k] is chunk k. A sum
// into fp32 from fp32 or bf16 (the gradients' case) runs a blocked vector
// loop, compiled for AVX2 and AVX-512 too and picked at run time; every
// path gives accumulate_element's bits. `out` may be one of the pieces
// (each element is read before it is written), not partly overlap one.
void accumulate_rank_pieces_cpu(const void* const* pieces, DType in, int n, int64_t count, void* out,
                                DType out_dtype, math::ElementOp op, double divisor);

// Wire accumulation (ReduceAccumulate::kWire) over n pieces in rank order:
// out[i] = p_{n-1}[i] (op) (... (p_1[i] (op) p_0[i])), every step
// reduce_pair_element's (in fp32, rounded to t), t the output's dtype too.
// Sums of fp32 and bf16 run a blocked vector loop per ISA. `out` may be one
// of the pieces.
void accumulate_rank_pieces_wire_cpu(const void* const* pieces, DType t, int n, int64_t count, void* out,
                                     math::ElementOp op);

}  // namespace mp

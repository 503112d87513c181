// kernels/cpu/update.h: the fused optimizer step over a flat shard on the
// CPU: one pass, vectorized, multi-threaded. The element math is
// kernels/update_math.h, shared with the CUDA kernel (modes, scalars and the
// per-range table are described there).
//
// Vectorization: the loop is compiled several times (kernels/cpu/
// update_<isa>.cc): a scalar reference (vectorizer off), the x86-64
// baseline (SSE2), AVX2 (+F16C) and AVX-512 (F, BW, VL); CpuIsa::kAuto picks
// the widest the CPU supports at run time. All of them compute the same
// bits: no FMA contraction (-ffp-contract=off), correctly rounded sqrt and
// division, integer conversions; tests compare each with the scalar one.
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/update_args.h"

namespace mp {

// One step. With scalars.found_inf nothing is written. Throws EnforceError
// naming what is wrong with the arguments or the range table.
void fused_update_cpu(const UpdateArgs& args, const StepScalars& scalars);

// Bytes the step moves per parameter (read + written), for benchmarks and
// the memory plan.
int64_t update_bytes_per_param(const UpdateArgs& args);

}  // namespace mp

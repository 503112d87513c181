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

#include "kernels/convert.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/update_math.h"

namespace mp {


struct UpdateArgs {
  OptimizerHyper hyper;
  int64_t n = 0;
  MasterMode master_mode = MasterMode::kFp32;
  float* master = nullptr;            // kFp32: the shard's fp32 master
  int16_t* master_remainder = nullptr;  // kBf16Remainder: the remainder; param_out is the bf16 half
  // Optimizer state: AdamW m and v, Lion m, SGD the momentum buffer
  // (state1 unused; both unused for SGD without momentum).
  void* state0 = nullptr;
  void* state1 = nullptr;
  DType state_dtype = DType::kF32;  // fp32 or bf16
  const void* grad = nullptr;
  DType grad_dtype = DType::kF32;   // fp32, bf16 or fp16
  // kFp32: the copy to write (may be null); kBf16Remainder: the bf16 half
  // of the master, updated in place; kNone: the parameter itself.
  void* param_out = nullptr;
  DType param_dtype = DType::kBF16; // fp32, bf16 or fp16 (bf16 for kBf16Remainder)
  Rounding rounding = Rounding::kNearestEven;  // of param_out (kFp32 and kNone)
  // Stochastic rounding draws philox_u32(seed, scalars.step, index_offset + i).
  uint64_t seed = 0;
  uint64_t index_offset = 0;
  // Parameter groups: sorted, contiguous, covering [0, n); null means one
  // range with both scales 1.
  const UpdateRange* ranges = nullptr;
  int64_t num_ranges = 0;
  int threads = 0;                  // 0: default_cpu_threads()
  CpuIsa isa = CpuIsa::kAuto;
};

// One step. With scalars.found_inf nothing is written. Throws EnforceError
// naming what is wrong with the arguments or the range table.
void fused_update_cpu(const UpdateArgs& args, const StepScalars& scalars);

// Bytes the step moves per parameter (read + written), for benchmarks and
// the memory plan.
int64_t update_bytes_per_param(const UpdateArgs& args);

}  // namespace mp

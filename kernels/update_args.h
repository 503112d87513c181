// kernels/update_args.h: the arguments of one fused optimizer step over a
// flat shard, for every device: fused_update_cpu (kernels/cpu/update.h) and
// fused_update_cuda (kernels/cuda/update_cuda.h) take the same UpdateArgs,
// and ops::fused_update (kernels/ops.h) picks between them. The element
// math, modes, scalars and the per-range table are kernels/update_math.h.
#pragma once

#include <cstdint>

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
  // The rule's state arrays (kernels/optim_math.h; unused beyond its count).
  void* state0 = nullptr;
  void* state1 = nullptr;
  // Elements in state1 (the range table's state1_shift leave some out); -1: n.
  int64_t state1_numel = -1;
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

}  // namespace mp

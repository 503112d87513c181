// kernels/cpu/update.h: one fused optimizer step over a flat shard with an
// fp32 master: reads the gradient in the dtype it arrived in (times the
// gradient multiplier), updates master and moments in one pass, and writes
// the low-precision parameter copy (the next all-gather's send buffer)
// rounded to nearest-even or stochastically.
//
// Master modes: kFp32 (an fp32 array), kBf16Remainder (the bf16 copy plus
// an int16 remainder, kernels/remainder_math.h: the same fp32 values in 4
// bytes, so its trajectory is bitwise that of kFp32), or kNone (pure low
// precision: param_out is the parameter itself, read, updated in fp32 and
// rounded back to nearest-even or stochastically; stochastic rounding keeps
// updates smaller than half an ulp from vanishing, in expectation).
//
// Not here yet (issue 4): the per-range metadata table, explicit SIMD
// dispatch and threads, and the CUDA kernel.
#pragma once

#include <cstdint>

#include "kernels/convert.h"
#include "kernels/optim_math.h"

namespace mp {

enum class OptimizerKind : uint8_t { kAdamW = 0, kSgd = 1, kLion = 2 };
enum class MasterMode : uint8_t { kFp32 = 0, kBf16Remainder = 1, kNone = 2 };

struct UpdateArgs {
  OptimizerKind kind = OptimizerKind::kAdamW;
  int64_t n = 0;
  MasterMode master_mode = MasterMode::kFp32;
  float* master = nullptr;  // kFp32: the fp32 master weights of the shard
  // kBf16Remainder: the master as its bf16 copy (updated in place; it is
  // the all-gather's send buffer) and an int16 remainder.
  uint16_t* master_bf16 = nullptr;
  int16_t* master_remainder = nullptr;
  // Optimizer state: AdamW m and v, Lion m, SGD the momentum buffer
  // (state1 unused; both unused for SGD without momentum).
  void* state0 = nullptr;
  void* state1 = nullptr;
  DType state_dtype = DType::kF32;  // fp32 or bf16
  const void* grad = nullptr;
  DType grad_dtype = DType::kF32;   // fp32, bf16 or fp16
  // kFp32: the copy to write (may be null); kNone: the parameter itself.
  void* param_out = nullptr;
  DType param_dtype = DType::kBF16; // fp32, bf16 or fp16
  float grad_multiplier = 1.0f;     // 1 / (loss_scale x divisor) x clip coefficient
  Rounding rounding = Rounding::kNearestEven;  // of param_out
  uint64_t seed = 0;                // stochastic rounding: philox_u32(seed, step, index_offset + i)
  uint64_t step = 0;
  uint64_t index_offset = 0;
  math::AdamWStep adamw;
  math::SgdStep sgd;
  math::LionStep lion;
};

// One step. With found_inf nothing is written (parameters, state and copy
// keep their bits): the step is skipped, as torch's fused optimizers do.
void fused_update_cpu(const UpdateArgs& args, bool found_inf);

}  // namespace mp

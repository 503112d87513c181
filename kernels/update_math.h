// kernels/update_math.h: the per-element body of the fused optimizer step,
// one definition for the CPU loops (kernels/cpu/update*.cc) and the CUDA
// kernel (kernels/cuda/update.cu), plus the plain structs both take.
//
// A step reads, per element: the gradient (fp32, bf16 or fp16) times the
// gradient multiplier, the master (three modes, below) and the moments
// (fp32 or bf16); it writes master, moments and the parameter copy in the
// compute dtype, rounded to nearest-even or stochastically.
//
// Master modes:
// - kFp32: an fp32 array; the copy (param_out, may be null) is written from it.
// - kBf16Remainder: the bf16 copy plus an int16 remainder
//   (kernels/remainder_math.h): the same fp32 values in 4 bytes, so the
//   trajectory is bitwise that of kFp32; the copy is the bf16 half itself.
// - kNone: pure low precision: param_out is the parameter, read, updated in
//   fp32 and rounded back (stochastic rounding keeps updates below half an
//   ulp from vanishing, in expectation).
//
// The learning rate, the gradient multiplier, the step number and found_inf
// are StepScalars, which the CUDA kernel reads from device memory, so a step
// needs no host synchronisation. The element rule (kernels/optim_math.h)
// makes its constants per range from them (step_constants): bias
// corrections and SGD's first-step flag from the step number, the learning
// rate and weight decay scaled by the range's multipliers.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/convert_math.h"
#include "kernels/optim_math.h"
#include "kernels/philox_math.h"
#include "kernels/remainder_math.h"

namespace mp {

enum class MasterMode : uint8_t { kFp32 = 0, kBf16Remainder = 1, kNone = 2 };

// What changes every step. On CUDA these live in device memory, written by
// the kernels that compute them (loss scaler, clipping, step counter).
struct StepScalars {
  float lr = 1e-3f;
  // 1 / (loss_scale x divisor) x clip coefficient.
  float grad_multiplier = 1.0f;
  // Nonzero: the step is a no-op (parameters, moments and copy keep their
  // bits; the caller does not advance the step number).
  int32_t found_inf = 0;
  int32_t pad_ = 0;
  // The step being taken, counting from 1: bias correction, SGD's first
  // step, and the stochastic-rounding stream.
  int64_t step = 1;
};

// One parameter group's run of the flat shard: elements [begin, end) use
// lr x lr_scale and weight_decay x weight_decay_scale (0 for biases and
// norms). A table is sorted, contiguous and covers the whole shard.
struct UpdateRange {
  int64_t begin = 0;
  int64_t end = 0;
  float lr_scale = 1.0f;
  float weight_decay_scale = 1.0f;
  // Nonzero: the update leaves these elements alone (no moment, master or
  // copy written): the matrices of a kind that updates them whole, apart
  // (runtime/matrix_step.h). Read by the CPU loop and the CUDA kernel alike.
  int32_t skip = 0;
  int32_t pad_ = 0;
  // The second state array's element i is state1[i - state1_shift]: state1
  // need not hold the skipped elements' (compact_state1 in
  // optim/optimizer.h). A multiple of 64, so every array's packs and cache
  // lines stay aligned with each other; 0 for every range of a full state1.
  int64_t state1_shift = 0;
};

namespace math {

// Rule's constants for one range of a step: the lr and weight decay times
// the range's scales.
template <class Rule>
MP_HD typename Rule::Step step_constants(const OptimizerHyper& h, const StepScalars& s, float lr_scale,
                                         float weight_decay_scale) {
  return Rule::step(h, s.lr * lr_scale, h.weight_decay * weight_decay_scale, s.step);
}

// What the element writes besides master and moments.
enum class CopyMode : uint8_t {
  kNone,        // kFp32 master without a copy
  kNearest,     // the copy (kFp32) or the parameter (kNone) rounded to nearest-even
  kStochastic,  // ... rounded stochastically
};

// Typed pointers of one step. With kBf16Remainder,
// Out is bf16 and `out` is the bf16 half of the master.
template <class G, class S, class Out>
struct UpdatePointers {
  const G* grad;
  float* master;          // kFp32
  int16_t* remainder;     // kBf16Remainder
  S* state0;              // the rule's first state array (AdamW m, SGD momentum buffer, Lion m)
  S* state1;              // its second (AdamW v)
  Out* out;               // the copy, the bf16 half, or the kNone parameter
};

// Element i of a step. `rng_index` is the element's global index for the
// stochastic-rounding stream philox(seed, step, rng_index).
template <class Rule, MasterMode kMode, CopyMode kCopy, class G, class S, class Out>
MP_HD void update_element(const UpdatePointers<G, S, Out>& p, int64_t i, float grad_multiplier,
                          const typename Rule::Step& c, uint64_t seed, uint64_t step, uint64_t rng_index) {
  const float g = to_f32(p.grad[i]) * grad_multiplier;
  float w;
  if constexpr (kMode == MasterMode::kFp32) {
    w = p.master[i];
  } else if constexpr (kMode == MasterMode::kBf16Remainder) {
    w = merge_bf16_remainder(p.out[i].bits, p.remainder[i]);
  } else {
    w = to_f32(p.out[i]);
  }
  float s0 = 0.0f, s1 = 0.0f;
  if constexpr (Rule::kStates >= 1) s0 = to_f32(p.state0[i]);
  if constexpr (Rule::kStates >= 2) s1 = to_f32(p.state1[i]);
  Rule::element(w, s0, s1, g, c);
  if constexpr (Rule::kStates >= 1) p.state0[i] = from_f32<S>(s0);
  if constexpr (Rule::kStates >= 2) p.state1[i] = from_f32<S>(s1);
  if constexpr (kMode == MasterMode::kBf16Remainder) {
    const Bf16Remainder split = split_bf16_remainder(w);
    p.out[i] = bf16{split.h};
    p.remainder[i] = split.r;
  } else {
    if constexpr (kMode == MasterMode::kFp32) p.master[i] = w;
    if constexpr (kCopy == CopyMode::kNearest) {
      p.out[i] = from_f32<Out>(w);
    } else if constexpr (kCopy == CopyMode::kStochastic) {
      p.out[i] = from_f32_stochastic<Out>(w, philox_u32(seed, step, rng_index));
    }
  }
}

}  // namespace math
}  // namespace mp

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
// needs no host synchronisation. Bias corrections and SGD's first-step flag
// are derived from the step number per range (make_step_constants), the
// learning rate and weight decay scaled by the range's multipliers.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/convert_math.h"
#include "kernels/optim_math.h"
#include "kernels/philox_math.h"
#include "kernels/remainder_math.h"

namespace mp {

enum class OptimizerKind : uint8_t { kAdamW = 0, kSgd = 1, kLion = 2 };
enum class MasterMode : uint8_t { kFp32 = 0, kBf16Remainder = 1, kNone = 2 };

// Hyperparameters fixed for a run (torch.optim's names and defaults except
// where noted). beta1 and beta2 are AdamW's or Lion's (Lion: 0.9, 0.99).
struct OptimizerHyper {
  OptimizerKind kind = OptimizerKind::kAdamW;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled for AdamW and Lion, L2 for SGD
  float momentum = 0.0f;      // SGD
  float dampening = 0.0f;     // SGD
  bool nesterov = false;      // SGD
};

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
  // copy written): optimizer kind MUON's matrices, which the engine updates
  // apart (runtime/muon_exchange.h). Read by the CPU loop and the CUDA
  // kernel alike.
  int32_t skip = 0;
  int32_t pad_ = 0;
  // AdamW's second moment of element i is state1[i - state1_shift]: state1
  // need not hold the skipped elements' (compact_state1 in
  // optim/optimizer.h). A multiple of 64, so every array's packs and cache
  // lines stay aligned with each other; 0 for every range of a full state1.
  int64_t state1_shift = 0;
};

namespace math {

// The per-range constants of one step (only the optimizer's own is used).
struct StepConstants {
  AdamWStep adamw;
  SgdStep sgd;
  LionStep lion;
};

// Bias corrections in fp64 from the step number, rounded once to fp32.
MP_HD StepConstants make_step_constants(const OptimizerHyper& h, const StepScalars& s, float lr_scale,
                                        float weight_decay_scale) {
  StepConstants c;
  const float lr = s.lr * lr_scale;
  const float wd = h.weight_decay * weight_decay_scale;
  const double t = static_cast<double>(s.step);
  c.adamw.lr = lr;
  c.adamw.beta1 = h.beta1;
  c.adamw.beta2 = h.beta2;
  c.adamw.eps = h.eps;
  c.adamw.weight_decay = wd;
  c.adamw.bias_correction1 = static_cast<float>(1.0 - pow(static_cast<double>(h.beta1), t));
  c.adamw.bias_correction2_sqrt = static_cast<float>(sqrt(1.0 - pow(static_cast<double>(h.beta2), t)));
  c.sgd.lr = lr;
  c.sgd.momentum = h.momentum;
  c.sgd.dampening = h.dampening;
  c.sgd.weight_decay = wd;
  c.sgd.nesterov = h.nesterov;
  c.sgd.first_step = s.step <= 1;
  c.lion.lr = lr;
  c.lion.beta1 = h.beta1;
  c.lion.beta2 = h.beta2;
  c.lion.weight_decay = wd;
  return c;
}

// The optimizers as the element loop sees them: SGD without momentum has no
// state to read or write.
enum class ElementKind : uint8_t { kAdamW, kSgdMomentum, kSgdPlain, kLion };

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
  S* state0;              // AdamW m, SGD momentum buffer, Lion m
  S* state1;              // AdamW v
  Out* out;               // the copy, the bf16 half, or the kNone parameter
};

// Element i of a step. `rng_index` is the element's global index for the
// stochastic-rounding stream philox(seed, step, rng_index).
template <ElementKind kKind, MasterMode kMode, CopyMode kCopy, class G, class S, class Out>
MP_HD void update_element(const UpdatePointers<G, S, Out>& p, int64_t i, float grad_multiplier,
                          const StepConstants& c, uint64_t seed, uint64_t step, uint64_t rng_index) {
  const float g = to_f32(p.grad[i]) * grad_multiplier;
  float w;
  if constexpr (kMode == MasterMode::kFp32) {
    w = p.master[i];
  } else if constexpr (kMode == MasterMode::kBf16Remainder) {
    w = merge_bf16_remainder(p.out[i].bits, p.remainder[i]);
  } else {
    w = to_f32(p.out[i]);
  }
  if constexpr (kKind == ElementKind::kAdamW) {
    float m = to_f32(p.state0[i]);
    float v = to_f32(p.state1[i]);
    adamw_element(w, m, v, g, c.adamw);
    p.state0[i] = from_f32<S>(m);
    p.state1[i] = from_f32<S>(v);
  } else if constexpr (kKind == ElementKind::kSgdMomentum) {
    float b = to_f32(p.state0[i]);
    sgd_element(w, b, g, c.sgd);
    p.state0[i] = from_f32<S>(b);
  } else if constexpr (kKind == ElementKind::kSgdPlain) {
    float unused = 0.0f;
    sgd_element(w, unused, g, c.sgd);
  } else {
    float m = to_f32(p.state0[i]);
    lion_element(w, m, g, c.lion);
    p.state0[i] = from_f32<S>(m);
  }
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

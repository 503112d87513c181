// kernels/optim_math.h: the fused optimizer step's element rules, in fp32,
// run by its element body (kernels/update_math.h) on the CPU and CUDA
// alike; an optimizer kind's entry names its rule (optim/optimizer_kind.h).
// As torch.optim (docs/optimizers.md "Reference semantics"):
// - AdamW: p *= 1 - lr * wd; m += (1 - b1) (g - m); v = b2 v + (1 - b2) g^2;
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps), bc_k = 1 - b_k^step.
// - SGD: g += wd p; b = g on the first step, else b = mu b + (1 - dampening) g;
//   d = nesterov ? g + mu b : b; p -= lr d (kSgd: no momentum, no buffer).
// - Lion: p *= 1 - lr * wd; c = b1 m + (1 - b1) g; p -= lr sign(c);
//   m = b2 m + (1 - b2) g.
// A rule: kId; kStates, its state arrays per element (state0, state1; at
// most 2); Step, its constants for a step and range, from step(hyper, lr,
// weight decay, step number from 1); element(p, s0, s1, g, step), unused
// states ignored, g already times 1 / (loss_scale x divisor) x clip.
// A new rule: its id, its struct, its place in UpdateRules.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/hd.h"

namespace mp {

enum class UpdateRule : uint8_t { kAdamW, kSgd, kSgdMomentum, kLion };

// Fixed for a run: the rule and its hyperparameters (torch.optim's names and
// defaults except where noted). beta1 and beta2 are AdamW's or Lion's.
struct OptimizerHyper {
  UpdateRule rule = UpdateRule::kAdamW;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled for AdamW and Lion, L2 for SGD
  float momentum = 0.0f;      // SGD
  float dampening = 0.0f;     // SGD
  bool nesterov = false;      // SGD
};

namespace math {

struct AdamW {
  static constexpr UpdateRule kId = UpdateRule::kAdamW;
  static constexpr int kStates = 2;  // m, v
  struct Step { float lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2_sqrt; };
  MP_HD static Step step(const OptimizerHyper& h, float lr, float wd, int64_t t) {
    const double td = static_cast<double>(t);
    return {lr, h.beta1, h.beta2, h.eps, wd, static_cast<float>(1.0 - pow(static_cast<double>(h.beta1), td)),
            static_cast<float>(sqrt(1.0 - pow(static_cast<double>(h.beta2), td)))};
  }
  MP_HD static void element(float& p, float& m, float& v, float g, const Step& s) {
    p = p * (1.0f - s.lr * s.weight_decay);
    m = m + (1.0f - s.beta1) * (g - m);
    v = s.beta2 * v + (1.0f - s.beta2) * g * g;
    const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
    p = p - (s.lr / s.bias_correction1) * (m / denom);
  }
};

struct Sgd {
  static constexpr UpdateRule kId = UpdateRule::kSgd;
  static constexpr int kStates = 0;
  struct Step { float lr, momentum, dampening, weight_decay; bool nesterov, first_step; };
  MP_HD static Step step(const OptimizerHyper& h, float lr, float wd, int64_t t) {
    return {lr, h.momentum, h.dampening, wd, h.nesterov, t <= 1};
  }
  MP_HD static void element(float& p, float& buf, float&, float g, const Step& s) {
    g = g + s.weight_decay * p;
    float d = g;
    if (s.momentum != 0.0f) {
      buf = s.first_step ? g : s.momentum * buf + (1.0f - s.dampening) * g;
      d = s.nesterov ? g + s.momentum * buf : buf;
    }
    p = p - s.lr * d;
  }
};

struct SgdMomentum : Sgd {
  static constexpr UpdateRule kId = UpdateRule::kSgdMomentum;
  static constexpr int kStates = 1;  // the momentum buffer
};

struct Lion {
  static constexpr UpdateRule kId = UpdateRule::kLion;
  static constexpr int kStates = 1;  // m
  struct Step { float lr, beta1, beta2, weight_decay; };
  MP_HD static Step step(const OptimizerHyper& h, float lr, float wd, int64_t) { return {lr, h.beta1, h.beta2, wd}; }
  MP_HD static void element(float& p, float& m, float&, float g, const Step& s) {
    p = p * (1.0f - s.lr * s.weight_decay);
    const float c = s.beta1 * m + (1.0f - s.beta1) * g;
    const float sign = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
    p = p - s.lr * sign;
    m = s.beta2 * m + (1.0f - s.beta2) * g;
  }
};

template <class... Rules>
struct RuleList {};
using UpdateRules = RuleList<AdamW, Sgd, SgdMomentum, Lion>;

// f(Rule{}) for the rule of UpdateRules whose id is `id`; `none` if no rule has it.
template <class T, class F>
constexpr T with_rule(UpdateRule id, T none, F&& f) {
  return [&]<class... Rules>(RuleList<Rules...>) {
    T out = none;
    ((id == Rules::kId ? (void)(out = f(Rules{})) : void()), ...);
    return out;
  }(UpdateRules{});
}

constexpr int rule_states(UpdateRule id) {
  return with_rule(id, 0, [](auto rule) { return decltype(rule)::kStates; });
}

}  // namespace math
}  // namespace mp

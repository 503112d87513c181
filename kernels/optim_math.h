// kernels/optim_math.h: the per-element update rules of the optimizers, in
// fp32, called by the fused step's element body (kernels/update_math.h),
// which the CPU loops and the CUDA kernel share. They follow torch.optim's
// formulas (docs/optimizers.md "Reference semantics"):
// - AdamW: p *= 1 - lr * wd; m += (1 - b1) (g - m); v = b2 v + (1 - b2) g^2;
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps), bc_k = 1 - b_k^step.
// - SGD: g += wd p; b = g on the first step, else b = mu b + (1 - dampening) g;
//   d = nesterov ? g + mu b : b; p -= lr d.
// - Lion: p *= 1 - lr * wd; c = b1 m + (1 - b1) g; p -= lr sign(c);
//   m = b2 m + (1 - b2) g.
// Per-step constants (bias corrections, the first-step flag) are computed
// once on the host; the gradient arrives already multiplied by
// 1 / (loss_scale x divisor) x clip coefficient.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/hd.h"

namespace mp::math {

struct AdamWStep {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  float bias_correction1 = 1.0f;       // 1 - beta1^step
  float bias_correction2_sqrt = 1.0f;  // sqrt(1 - beta2^step)
};

struct SgdStep {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = true;  // the momentum buffer starts as the gradient
};

struct LionStep {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float weight_decay = 0.0f;
};

MP_HD void adamw_element(float& p, float& m, float& v, float g, const AdamWStep& s) {
  p = p * (1.0f - s.lr * s.weight_decay);
  m = m + (1.0f - s.beta1) * (g - m);
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  p = p - (s.lr / s.bias_correction1) * (m / denom);
}

MP_HD void sgd_element(float& p, float& buf, float g, const SgdStep& s) {
  g = g + s.weight_decay * p;
  float d = g;
  if (s.momentum != 0.0f) {
    buf = s.first_step ? g : s.momentum * buf + (1.0f - s.dampening) * g;
    d = s.nesterov ? g + s.momentum * buf : buf;
  }
  p = p - s.lr * d;
}

MP_HD void lion_element(float& p, float& m, float g, const LionStep& s) {
  p = p * (1.0f - s.lr * s.weight_decay);
  const float c = s.beta1 * m + (1.0f - s.beta1) * g;
  const float sign = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
  p = p - s.lr * sign;
  m = s.beta2 * m + (1.0f - s.beta2) * g;
}

}  // namespace mp::math

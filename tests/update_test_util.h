// tests/update_test_util.h: what the fused-update tests share: a typed
// array in raw bytes, every update rule, and the hyperparameters each is
// tested with.
#pragma once

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/convert_math.h"
#include "kernels/update_math.h"

namespace mp::testing {

// A typed array in raw bytes.
struct Array {
  DType dtype = DType::kF32;
  std::vector<unsigned char> bytes;
  Array() = default;
  Array(DType d, int64_t n) : dtype(d), bytes(static_cast<size_t>(n * dtype_size(d)), 0) {}
  void* data() { return bytes.empty() ? nullptr : bytes.data(); }
  float get(int64_t i) const {
    return dispatch_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      T x;
      std::memcpy(&x, bytes.data() + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
      return math::to_f32(x);
    });
  }
  void set(int64_t i, float v) {
    dispatch_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      const T x = math::from_f32<T>(v);
      std::memcpy(bytes.data() + i * static_cast<int64_t>(sizeof(T)), &x, sizeof(T));
    });
  }
};

// Every rule of math::UpdateRules: the update tests run each.
inline std::vector<UpdateRule> all_rules() {
  return []<class... Rules>(math::RuleList<Rules...>) { return std::vector<UpdateRule>{Rules::kId...}; }(
      math::UpdateRules{});
}

// Decay and, for SGD with momentum, dampening and Nesterov, so that every
// term of a rule is exercised.
inline OptimizerHyper hyper_for(UpdateRule rule) {
  OptimizerHyper h;
  h.rule = rule;
  switch (rule) {
    case UpdateRule::kAdamW: h.weight_decay = 0.1f; break;
    case UpdateRule::kSgdMomentum:
      h.momentum = 0.9f;
      h.dampening = 0.1f;
      h.nesterov = true;
      h.weight_decay = 1e-4f;
      break;
    case UpdateRule::kLion:
      h.beta1 = 0.9f;
      h.beta2 = 0.99f;
      h.weight_decay = 0.1f;
      break;
    default: break;  // plain SGD, and a new rule: its defaults
  }
  return h;
}

}  // namespace mp::testing

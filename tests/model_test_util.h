// tests/model_test_util.h: what the model tests share, GPT and MLP alike:
// the small test shapes, parameters as unit buffers of a FlatLayout, one
// micro-batch through the Model interface, and whole-model gradients
// against finite differences.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "kernels/convert.h"
#include "models/flat_layout.h"
#include "models/gpt.h"
#include "models/mlp.h"
#include "models/model.h"
#include "tests/model_reference.h"
#include "tests/test_util.h"

namespace mp::testing {

// ---- shapes -------------------------------------------------------------------

inline GptConfig gpt_config(int64_t vocab, int64_t context, int64_t channels, int64_t heads, int64_t layers,
                            int64_t micro_batch_size, int threads = 1) {
  GptConfig c;
  c.vocab = vocab;
  c.context = context;
  c.channels = channels;
  c.heads = heads;
  c.layers = layers;
  c.micro_batch_size = micro_batch_size;
  c.threads = threads;
  return c;
}

inline MlpConfig mlp_config(std::vector<int64_t> dims, int64_t micro_batch_size, int threads = 1) {
  MlpConfig c;
  c.dims = std::move(dims);
  c.micro_batch_size = micro_batch_size;
  c.threads = threads;
  return c;
}

// The small GPT-2 of the engine, checkpoint and Hugging Face tests: context
// 8, 16 channels, 2 heads, 2 layers, 2 sequences per micro-batch, 1 thread.
inline GptConfig small_gpt(int64_t vocab = 50) { return gpt_config(vocab, 8, 16, 2, 2, 2); }

// The small MLP of the engine and checkpoint tests: 12 inputs, hidden 24
// and 20, 6 classes, 1 thread.
inline MlpConfig small_mlp(int64_t micro_batch_size = 4) { return mlp_config({12, 24, 20, 6}, micro_batch_size); }

// ---- parameters in unit buffers -------------------------------------------------

using Units32 = std::vector<std::vector<float>>;
using Units64 = std::vector<std::vector<double>>;

// Unit buffers of `layout`'s padded size: normal parameters with the spec's
// scale times weight_mult, ones as 1 + bias_std N(0, 1), zeros as bias_std
// N(0, 1), gaps and padding `gap`.
inline Units32 init_params(const FlatLayout& layout, uint32_t seed, float weight_mult, float bias_std,
                           float gap = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Units32 units;
  for (const UnitLayout& unit : layout.units()) {
    std::vector<float> flat(static_cast<size_t>(unit.padded_numel), gap);
    for (const ParamPlacement& p : unit.params) {
      const bool weight = p.init.kind == ParamInit::Kind::kNormal;
      const float scale = weight ? static_cast<float>(p.init.scale) * weight_mult : bias_std;
      const float base = p.init.kind == ParamInit::Kind::kOnes ? 1.0f : 0.0f;
      for (int64_t i = 0; i < p.numel; ++i) flat[static_cast<size_t>(p.offset + i)] = base + scale * normal(rng);
    }
    units.push_back(std::move(flat));
  }
  return units;
}

inline Units64 to_double(const Units32& units) {
  Units64 out;
  for (const auto& u : units) out.emplace_back(u.begin(), u.end());
  return out;
}

inline Tensor wrap(std::vector<float>& v) {
  return Tensor::wrap(v.data(), Device::cpu(), DType::kF32, {static_cast<int64_t>(v.size())});
}

// A tensor over each unit buffer (no copy).
inline std::vector<Tensor> wrap_units(Units32& units) {
  std::vector<Tensor> out;
  for (std::vector<float>& u : units) out.push_back(wrap(u));
  return out;
}

// Which elements of the unit's padded buffer hold parameters (the rest are
// alignment gaps and padding).
inline std::vector<bool> param_elements(const UnitLayout& unit) {
  std::vector<bool> covered(static_cast<size_t>(unit.padded_numel), false);
  for (const ParamPlacement& pp : unit.params) {
    std::fill(covered.begin() + pp.offset, covered.begin() + pp.offset + pp.numel, true);
  }
  return covered;
}

// The largest |g| over the parameter's elements of its unit's gradient.
inline double max_abs(const std::vector<double>& unit_grads, const ParamPlacement& pp) {
  double m = 0.0;
  for (int64_t i = pp.offset; i < pp.offset + pp.numel; ++i) {
    m = std::max(m, std::abs(unit_grads[static_cast<size_t>(i)]));
  }
  return m;
}

// Each unit of p32 as `narrow` parameters and as fp32 parameters holding the
// same (rounded) values, with zero fp32 gradients for each.
struct NarrowAndRounded {
  std::vector<Tensor> narrow_params, rounded_params, narrow_grads, rounded_grads;
};
inline NarrowAndRounded narrow_and_rounded(Allocator& alloc, const Units32& p32, DType narrow) {
  NarrowAndRounded t;
  for (const std::vector<float>& unit : p32) {
    const auto n = static_cast<int64_t>(unit.size());
    const Tensor src = Tensor::wrap(const_cast<float*>(unit.data()), Device::cpu(), DType::kF32, {n});
    t.narrow_params.push_back(Tensor::empty(alloc, narrow, {n}, MemCategory::kOther));
    t.rounded_params.push_back(Tensor::empty(alloc, DType::kF32, {n}, MemCategory::kOther));
    convert(src, t.narrow_params.back());
    convert(t.narrow_params.back(), t.rounded_params.back());
    t.narrow_grads.push_back(Tensor::zeros(alloc, DType::kF32, {n}, MemCategory::kOther));
    t.rounded_grads.push_back(Tensor::zeros(alloc, DType::kF32, {n}, MemCategory::kOther));
  }
  return t;
}

// One micro-batch through a model's direct calls (each waits for its work);
// grads are overwritten in place.
template <class M>
double run_model(M& model, int64_t g, const std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  model.begin_micro_batch(g);
  const int units = static_cast<int>(params.size());
  for (int u = 0; u < units; ++u) model.forward(u, params[static_cast<size_t>(u)]);
  const double loss = model.loss();
  for (int u = units - 1; u >= 0; --u) {
    model.backward(u, params[static_cast<size_t>(u)], grads[static_cast<size_t>(u)]);
  }
  return loss;
}

// ---- gradients against finite differences -------------------------------------

struct FdErrors {
  double max_abs = 0.0;  // max |grad - fd|
  double max_rel = 0.0;  // max |grad - fd| / max(|fd|, floor)
};

// Every parameter element of p (gaps and padding of `layout` left alone)
// moved by +-1e-5: the central difference of loss(p) is expected within
// 1e-6 max(|fd|, floor) of `grads`, the gradient of loss at p.
template <class Loss>
FdErrors expect_gradients_match_finite_differences(const FlatLayout& layout, Units64& p, const Units64& grads,
                                                   double floor, Loss&& loss) {
  const double h = 1e-5;
  FdErrors errors;
  for (size_t u = 0; u < p.size(); ++u) {
    for (const ParamPlacement& pp : layout.unit(static_cast<int>(u)).params) {
      for (int64_t i = pp.offset; i < pp.offset + pp.numel; ++i) {
        double& v = p[u][static_cast<size_t>(i)];
        const double saved = v;
        v = saved + h;
        const double up = loss(p);
        v = saved - h;
        const double down = loss(p);
        v = saved;
        const double fd = (up - down) / (2 * h);
        const double g = grads[u][static_cast<size_t>(i)];
        const double scale = std::max(std::abs(fd), floor);
        errors.max_abs = std::max(errors.max_abs, std::abs(g - fd));
        errors.max_rel = std::max(errors.max_rel, std::abs(g - fd) / scale);
        EXPECT_NEAR(g, fd, 1e-6 * scale) << pp.name << "[" << i - pp.offset << "]";
      }
    }
  }
  return errors;
}

// Expects constructing an M from c to throw a ConfigError containing `expected`.
template <class M, class C>
void expect_config_error(const C& c, const std::string& expected) {
  const std::string message = error_of<ConfigError>([&] { M model(c); });
  EXPECT_NE(message.find(expected), std::string::npos) << message;
}

}  // namespace mp::testing

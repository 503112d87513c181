// tests/gpt_test_util.h: helpers shared by the GPT op and model tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/convert.h"
#include "models/gpt.h"
#include "kernels/cpu/gpt_ops.h"
#include "models/flat_layout.h"

namespace mp::gpt_test {

using Vec = std::vector<double>;
using Units32 = std::vector<std::vector<float>>;
using Units64 = std::vector<std::vector<double>>;

inline GptConfig make_config(int64_t vocab, int64_t context, int64_t channels, int64_t heads, int64_t layers,
                             int64_t batch, int threads = 1) {
  GptConfig c;
  c.vocab = vocab;
  c.context = context;
  c.channels = channels;
  c.heads = heads;
  c.layers = layers;
  c.micro_batch_size = batch;
  c.threads = threads;
  return c;
}

inline std::string sci(double v) {
  std::ostringstream os;
  os << std::scientific << v;
  return os.str();
}

inline Vec random_vec(size_t n, uint32_t seed, double scale = 1.0, double offset = 0.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Vec v(n);
  for (double& x : v) x = offset + scale * u(rng);
  return v;
}

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

// One micro-batch through the Model interface; grads are overwritten in place.
inline double run_model(Gpt& model, int64_t g, const std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  model.begin_micro_batch(g);
  const int units = static_cast<int>(params.size());
  for (int u = 0; u < units; ++u) model.forward(u, params[static_cast<size_t>(u)]);
  const double loss = model.loss();
  for (int u = units - 1; u >= 0; --u) {
    model.backward(u, params[static_cast<size_t>(u)], grads[static_cast<size_t>(u)]);
  }
  return loss;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

inline Batch load(const GptConfig& c, int64_t g) {
  Batch b;
  b.inputs.resize(static_cast<size_t>(c.micro_batch_size * c.context));
  b.targets.resize(b.inputs.size());
  GptData(c).micro_batch(g, b.inputs.data(), b.targets.data());
  return b;
}

// ---- op gradients against finite differences ---------------------------------

// Central differences of f with respect to every element of x, against
// `analytic`; the tolerance is relative with a floor, as f is O(1).
class FdCheck {
 public:
  explicit FdCheck(std::string op) : op_(std::move(op)) {}
  void check(const char* input, Vec& x, const Vec& analytic, const std::function<double()>& f) {
    ASSERT_EQ(x.size(), analytic.size()) << op_ << " " << input;
    const double h = 1e-5;
    for (size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = f();
      x[i] = saved - h;
      const double down = f();
      x[i] = saved;
      const double fd = (up - down) / (2 * h);
      const double scale = std::max(std::abs(fd), 1e-2);
      max_rel_ = std::max(max_rel_, std::abs(analytic[i] - fd) / scale);
      EXPECT_NEAR(analytic[i], fd, 1e-6 * scale) << op_ << ": d/d " << input << "[" << i << "]";
    }
  }
  ~FdCheck() { ::testing::Test::RecordProperty("max_rel_err_" + op_, sci(max_rel_)); }

 private:
  std::string op_;
  double max_rel_ = 0.0;
};

inline double weighted_sum(const Vec& out, const Vec& r) {
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * r[i];
  return s;
}

}  // namespace mp::gpt_test

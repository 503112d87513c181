// tests/gpt_test_util.h: what the GPT op and model tests add to
// tests/model_test_util.h: micro-batches of the synthetic data, random
// vectors and finite-difference checks of the ops in double.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "models/gpt.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

namespace mp::testing {

using Vec = std::vector<double>;

inline Vec random_vec(size_t n, uint32_t seed, double scale = 1.0, double offset = 0.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Vec v(n);
  for (double& x : v) x = offset + scale * u(rng);
  return v;
}

// Micro-batch g of the synthetic language of c.
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

}  // namespace mp::testing

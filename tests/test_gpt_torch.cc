// The GPT model (models/gpt.h) against PyTorch: tests/golden/gpt_tiny.json,
// written by tests/gpt_torch_reference.py (which says how to regenerate it),
// holds a tiny GPT-2's parameters, tokens, loss, every parameter gradient and
// the logits of the first two positions, computed by PyTorch in float64.
// gpt_loss_and_grads<double> must match them to rounding, the float path to
// fp32 accuracy. The padded vocabulary matters here (vocab 70, 128 rows of
// wte, the padded rows nonzero), as do the head layout (3 heads), the
// Conv1D [in, out] weights, LayerNorm eps and the tanh GELU: the parameters
// are large enough that attention and GELU are far from linear.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layernorm.h"
#include "models/flat_layout.h"
#include "models/gpt.h"
#include "tests/gpt_test_ops.h"
#include "tests/model_reference.h"
#include "tests/test_util.h"

#ifndef MP_TEST_GOLDEN_DIR
#error "MP_TEST_GOLDEN_DIR (tests/golden) must be defined by the build"
#endif

namespace mp {
namespace {

using testing::sci;

struct GoldenParam {
  std::string name;
  Shape shape;
  std::vector<double> values, grad;
};

struct Golden {
  GptConfig config;
  std::vector<int32_t> inputs, targets;
  double loss = 0.0;
  std::vector<int64_t> logit_rows;
  std::vector<std::vector<double>> logits;  // [row][vocab]
  std::vector<GoldenParam> params;           // in spec order
};

const Golden& golden() {
  static const Golden g = [] {
    const std::string path = std::string(MP_TEST_GOLDEN_DIR) + "/gpt_tiny.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    const nlohmann::json j = nlohmann::json::parse(in);
    Golden out;
    const nlohmann::json& c = j.at("config");
    out.config.vocab = c.at("vocab").get<int64_t>();
    out.config.context = c.at("context").get<int64_t>();
    out.config.channels = c.at("channels").get<int64_t>();
    out.config.heads = c.at("heads").get<int64_t>();
    out.config.layers = c.at("layers").get<int64_t>();
    out.config.micro_batch_size = c.at("micro_batch_size").get<int64_t>();
    out.config.threads = 1;
    if (c.at("padded_vocab").get<int64_t>() != gpt_padded_vocab(out.config.vocab)) {
      throw std::runtime_error(path + ": padded_vocab disagrees with gpt_padded_vocab");
    }
    out.inputs = j.at("inputs").get<std::vector<int32_t>>();
    out.targets = j.at("targets").get<std::vector<int32_t>>();
    out.loss = j.at("loss").get<double>();
    out.logit_rows = j.at("logits").at("rows").get<std::vector<int64_t>>();
    out.logits = j.at("logits").at("values").get<std::vector<std::vector<double>>>();
    for (const nlohmann::json& p : j.at("params")) {
      out.params.push_back(GoldenParam{p.at("name").get<std::string>(), p.at("shape").get<Shape>(),
                                       p.at("values").get<std::vector<double>>(),
                                       p.at("grad").get<std::vector<double>>()});
    }
    return out;
  }();
  return g;
}

// Unit buffers in the layout of FlatLayout(spec, 1), gaps zero.
template <class T>
std::vector<std::vector<T>> unit_params(const FlatLayout& layout, const Golden& g) {
  std::vector<std::vector<T>> units;
  for (const UnitLayout& unit : layout.units()) units.emplace_back(static_cast<size_t>(unit.padded_numel), T(0));
  for (const GoldenParam& p : g.params) {
    const ParamPlacement& pp = layout.param(p.name);
    std::transform(p.values.begin(), p.values.end(), units[static_cast<size_t>(pp.unit)].begin() + pp.offset,
                   [](double v) { return static_cast<T>(v); });
  }
  return units;
}

class GptTorch : public ::testing::Test {
 protected:
  void SetUp() override {
    const Golden& g = golden();
    const int64_t tokens = g.config.micro_batch_size * g.config.context;
    ASSERT_EQ(static_cast<int64_t>(g.inputs.size()), tokens);
    ASSERT_EQ(static_cast<int64_t>(g.targets.size()), tokens);
    // The golden file names every parameter of the spec, in order, with its shape.
    std::vector<const ParamPlacement*> spec;
    for (const UnitLayout& unit : layout_.units()) {
      for (const ParamPlacement& pp : unit.params) spec.push_back(&pp);
    }
    ASSERT_EQ(g.params.size(), spec.size());
    for (size_t i = 0; i < spec.size(); ++i) {
      const GoldenParam& p = g.params[i];
      ASSERT_EQ(p.name, spec[i]->name);
      ASSERT_EQ(p.shape, spec[i]->shape) << p.name;
      ASSERT_EQ(static_cast<int64_t>(p.values.size()), spec[i]->numel) << p.name;
      ASSERT_EQ(static_cast<int64_t>(p.grad.size()), spec[i]->numel) << p.name;
    }
  }

  // Runs gpt_loss_and_grads<T>; returns the loss's relative error and, in
  // *max_grad_err, the largest |grad - torch| / max |torch grad of that
  // parameter| over all parameters. Checks each against the tolerances.
  template <class T>
  double check(double loss_tol, double grad_tol, double* max_grad_err) {
    const Golden& g = golden();
    const std::vector<std::vector<T>> params = unit_params<T>(layout_, g);
    std::vector<std::vector<T>> grads;
    const double loss = gpt_loss_and_grads<T>(g.config, g.inputs.data(), g.targets.data(), params, grads);
    const double loss_err = std::abs(loss - g.loss) / g.loss;
    EXPECT_LE(loss_err, loss_tol) << "loss " << loss << ", torch " << g.loss;
    *max_grad_err = 0.0;
    for (const GoldenParam& p : g.params) {
      const ParamPlacement& pp = layout_.param(p.name);
      const T* grad = grads[static_cast<size_t>(pp.unit)].data() + pp.offset;
      double scale = 0.0;
      for (double v : p.grad) scale = std::max(scale, std::abs(v));
      EXPECT_GT(scale, 0.0) << p.name;
      double worst = 0.0;
      size_t worst_at = 0;
      for (size_t i = 0; i < p.grad.size(); ++i) {
        const double err = std::abs(static_cast<double>(grad[i]) - p.grad[i]) / scale;
        if (!(err <= worst)) {  // NaN counts as worst
          worst = err;
          worst_at = i;
        }
      }
      EXPECT_LE(worst, grad_tol) << p.name << "[" << worst_at << "]: " << grad[worst_at] << ", torch "
                                 << p.grad[worst_at] << " (max |torch grad| " << scale << ")";
      *max_grad_err = std::max(*max_grad_err, worst);
    }
    // The padded rows of wte take no part in the loss (torch's gradient there is exactly zero).
    const ParamPlacement& wte = layout_.param("wte");
    for (int64_t i = g.config.vocab * g.config.channels; i < wte.numel; ++i) {
      const T v = grads[static_cast<size_t>(wte.unit)][static_cast<size_t>(wte.offset + i)];
      EXPECT_EQ(v, T(0)) << "wte[" << i / g.config.channels << ", " << i % g.config.channels << "]";
    }
    return loss_err;
  }

  FlatLayout layout_{Gpt::spec_for(golden().config), 1};
};

// Tolerances: measured (PyTorch 2.15, x86-64) loss 0, gradients 4e-15 in
// double; loss 2e-8, gradients 4e-6 (h1.ln_1.bias) in float. A golden file
// of a model with LayerNorm eps 1.1e-5 or GELU coefficient 0.04472 instead
// of 0.044715 (gpt_torch_reference.py --ln-eps / --gelu-coef) gives loss
// errors above 5e-8 and gradient errors above 6e-6 in double.
TEST_F(GptTorch, DoubleLossAndGradientsMatchPyTorch) {
  double grad_err = 0.0;
  const double loss_err = check<double>(1e-12, 1e-11, &grad_err);
  RecordProperty("loss_rel_err", sci(loss_err));
  RecordProperty("max_grad_err", sci(grad_err));
}

TEST_F(GptTorch, FloatLossAndGradientsMatchPyTorch) {
  double grad_err = 0.0;
  const double loss_err = check<float>(1e-6, 2e-5, &grad_err);
  RecordProperty("loss_rel_err", sci(loss_err));
  RecordProperty("max_grad_err", sci(grad_err));
}

// The forward alone, from the ops in unit order (as models/gpt.cc composes
// them), against torch's logits (measured error 1.3e-15 relative to max(|logit|, 1)).
TEST_F(GptTorch, DoubleLogitsMatchPyTorch) {
  const Golden& g = golden();
  const GptConfig& c = g.config;
  const int64_t rows = c.micro_batch_size * c.context, ch = c.channels, vp = gpt_padded_vocab(c.vocab);
  const std::vector<std::vector<double>> params = unit_params<double>(layout_, g);
  auto at = [&](const std::string& name) {
    const ParamPlacement& pp = layout_.param(name);
    return params[static_cast<size_t>(pp.unit)].data() + pp.offset;
  };
  using V = std::vector<double>;
  const auto n = static_cast<size_t>(rows * ch);
  V x(n), ln(n), mean(static_cast<size_t>(rows)), rstd(mean.size()), qkv(3 * n), atty(n), branch(n), fc(4 * n),
      fc_gelu(4 * n), logits(static_cast<size_t>(rows * vp));
  V att(static_cast<size_t>(c.micro_batch_size * c.heads * c.context * c.context));
  gpt_embedding_forward(g.inputs.data(), at("wte"), at("wpe"), c.micro_batch_size, c.context, ch, vp, x.data(), 1);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string h = "h" + std::to_string(l) + ".";
    gpt_layernorm_forward(x.data(), at(h + "ln_1.weight"), at(h + "ln_1.bias"), rows, ch, ln.data(), mean.data(),
                          rstd.data(), 1);
    gpt_matmul_forward(ln.data(), at(h + "attn.c_attn.weight"), at(h + "attn.c_attn.bias"), rows, ch, 3 * ch,
                       qkv.data(), 1);
    gpt_attention_forward(qkv.data(), c.micro_batch_size, c.context, ch, c.heads, att.data(), atty.data(), 1);
    gpt_matmul_forward(atty.data(), at(h + "attn.c_proj.weight"), at(h + "attn.c_proj.bias"), rows, ch, ch,
                       branch.data(), 1);
    gpt_add(x.data(), branch.data(), rows * ch, x.data(), 1);
    gpt_layernorm_forward(x.data(), at(h + "ln_2.weight"), at(h + "ln_2.bias"), rows, ch, ln.data(), mean.data(),
                          rstd.data(), 1);
    gpt_matmul_forward(ln.data(), at(h + "mlp.c_fc.weight"), at(h + "mlp.c_fc.bias"), rows, ch, 4 * ch, fc.data(),
                       1);
    gpt_gelu_forward(fc.data(), rows * 4 * ch, fc_gelu.data(), 1);
    gpt_matmul_forward(fc_gelu.data(), at(h + "mlp.c_proj.weight"), at(h + "mlp.c_proj.bias"), rows, 4 * ch, ch,
                       branch.data(), 1);
    gpt_add(x.data(), branch.data(), rows * ch, x.data(), 1);
  }
  gpt_layernorm_forward(x.data(), at("ln_f.weight"), at("ln_f.bias"), rows, ch, ln.data(), mean.data(), rstd.data(),
                        1);
  gpt_logits_forward(ln.data(), at("wte"), rows, ch, vp, logits.data(), 1);
  ASSERT_EQ(g.logits.size(), g.logit_rows.size());
  double max_err = 0.0;
  for (size_t r = 0; r < g.logit_rows.size(); ++r) {
    const int64_t row = g.logit_rows[r];
    ASSERT_LT(row, rows);
    ASSERT_EQ(static_cast<int64_t>(g.logits[r].size()), c.vocab);
    for (int64_t v = 0; v < c.vocab; ++v) {
      const double ref = g.logits[r][static_cast<size_t>(v)];
      const double got = logits[static_cast<size_t>(row * vp + v)];
      const double err = std::abs(got - ref) / std::max(std::abs(ref), 1.0);
      max_err = std::max(max_err, err);
      EXPECT_LE(err, 1e-12) << "logits[" << row << ", " << v << "]: " << got << ", torch " << ref;
    }
  }
  RecordProperty("max_logit_err", sci(max_err));
}

}  // namespace
}  // namespace mp

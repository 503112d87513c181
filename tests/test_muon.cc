// optim/muon.h: the Muon step on one matrix against a float64 reference of
// the whole step over three steps (Note [Muon step tolerances] in
// tests/muon_reference.h), against torch.optim.Muon itself
// (tests/golden/muon_torch.json, written by tests/muon_torch_reference.py),
// torch's adjusted learning rates, the same bits for any thread count, and
// which GPT parameters Muon takes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/newton_schulz.h"
#include "models/gpt.h"
#include "optim/muon.h"
#include "tests/model_test_util.h"
#include "tests/muon_reference.h"
#include "tests/test_util.h"

#ifndef MP_TEST_GOLDEN_DIR
#error "MP_TEST_GOLDEN_DIR (tests/golden) must be defined by the build"
#endif

namespace mp {
namespace {

using testing::ref_distance;
using testing::sci;

struct StepsResult {
  std::vector<float> param, momentum;
};

// `grads.size()` steps of muon_step_cpu from param (momentum zeros).
StepsResult run_steps(const MuonHyper& h, int64_t rows, int64_t cols, std::vector<float> param,
              const std::vector<std::vector<float>>& grads, double lr, double wd, int threads = 0,
              bool own_scratch = false) {
  StepsResult r{std::move(param), std::vector<float>(static_cast<size_t>(rows * cols), 0.0f)};
  std::vector<float> scratch;
  if (own_scratch) scratch.assign(static_cast<size_t>(muon_scratch_elements(rows, cols, h)), std::nanf(""));
  for (const std::vector<float>& g : grads) {
    MuonMatrix m;
    m.param = r.param.data();
    m.momentum = r.momentum.data();
    m.grad = g.data();
    m.rows = rows;
    m.cols = cols;
    MuonStep s;
    s.lr = lr;
    s.weight_decay = wd;
    s.threads = threads;
    if (own_scratch) {
      s.scratch = scratch.data();
      s.scratch_elements = static_cast<int64_t>(scratch.size());
    }
    muon_step_cpu(h, m, s);
  }
  return r;
}

std::vector<std::vector<double>> to_double(const std::vector<std::vector<float>>& v) {
  std::vector<std::vector<double>> out;
  for (const auto& x : v) out.push_back(testing::to_double(x));
  return out;
}

struct Case {
  std::string name;
  MuonHyper hyper;
  double lr, wd;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"defaults", MuonHyper{}, 0.02, 0.1});
  MuonHyper heavy;
  heavy.momentum = 0.9;
  heavy.nesterov = false;
  heavy.adjust_lr = MuonAdjustLr::kMatchRmsAdamW;
  out.push_back({"heavy_ball", heavy, 0.05, 0.05});
  MuonHyper spectral;
  spectral.momentum = 0.3;  // the other branch of torch's lerp for both lerps
  spectral.adjust_lr = MuonAdjustLr::kSpectralUnclamped;
  spectral.ns_steps = 4;
  out.push_back({"spectral", spectral, 0.03, 0.0});
  return out;
}

TEST(Muon, ThreeStepsMatchTheFloat64Reference) {
  const int64_t rows = 48, cols = 64;
  const std::vector<float> param = testing::random_values(rows * cols, 1, 0.05f);
  std::vector<std::vector<float>> grads;
  for (uint32_t t = 0; t < 3; ++t) grads.push_back(testing::random_values(rows * cols, 10 + t));
  for (Case c : cases()) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      for (const bool tall : {false, true}) {
        c.hyper.iteration_dtype = dtype;
        const int64_t r = tall ? cols : rows, k = tall ? rows : cols;
        const std::string what = c.name + " " + std::string(dtype_name(dtype)) + (tall ? " tall" : " wide");
        const StepsResult mp = run_steps(c.hyper, r, k, param, grads, c.lr, c.wd);
        const testing::MuonReferenceRun ref = testing::muon_reference_run(
            c.hyper, r, k, r, k, testing::to_double(param), to_double(grads), c.lr, c.wd);
        const double dp = ref_distance(testing::to_double(mp.param), ref.param);
        const double dm = ref_distance(testing::to_double(mp.momentum), ref.momentum);
        EXPECT_LE(dp, ref.param_bound) << what;
        EXPECT_LE(dm, ref.momentum_bound) << what;
        RecordProperty("param " + what, sci(dp) + " (bound " + sci(ref.param_bound) + ")");
      }
    }
  }
}

TEST(Muon, AdjustedLrIsTorchs) {
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.02, MuonAdjustLr::kOriginal, 64, 48), 0.02 * std::sqrt(64.0 / 48.0));
  EXPECT_EQ(muon_adjusted_lr(0.02, MuonAdjustLr::kOriginal, 48, 64), 0.02);  // max(1, A / B)
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.02, MuonAdjustLr::kMatchRmsAdamW, 48, 64), 0.02 * 0.2 * 8.0);
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.02, MuonAdjustLr::kSpectralUnclamped, 48, 64), 0.02 * std::sqrt(0.75));
}

TEST(Muon, SameBitsForAnyThreadCountAndScratch) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    MuonHyper h;
    h.iteration_dtype = dtype;
    const int64_t rows = 53, cols = 37;
    const std::vector<float> param = testing::random_values(rows * cols, 2, 0.05f);
    const std::vector<std::vector<float>> grads = {testing::random_values(rows * cols, 3),
                                                   testing::random_values(rows * cols, 4)};
    const StepsResult one = run_steps(h, rows, cols, param, grads, 0.02, 0.1, 1);
    const StepsResult two = run_steps(h, rows, cols, param, grads, 0.02, 0.1, 2, /*own_scratch=*/true);
    EXPECT_TRUE(testing::same_bits(one.param, two.param)) << dtype_name(dtype);
    EXPECT_TRUE(testing::same_bits(one.momentum, two.momentum)) << dtype_name(dtype);
  }
}

TEST(Muon, GradMultiplierScalesTheGradient) {
  MuonHyper h;
  const int64_t rows = 16, cols = 24;
  std::vector<float> g = testing::random_values(rows * cols, 5);
  std::vector<float> g4(g.size());
  for (size_t i = 0; i < g.size(); ++i) g4[i] = g[i] * 4.0f;  // exact
  const StepsResult plain = run_steps(h, rows, cols, std::vector<float>(g.size(), 0.5f), {g}, 0.02, 0.1);
  StepsResult scaled{std::vector<float>(g.size(), 0.5f), std::vector<float>(g.size(), 0.0f)};
  MuonMatrix m{.param = scaled.param.data(), .momentum = scaled.momentum.data(), .grad = g4.data(), .rows = rows, .cols = cols};
  MuonStep s;
  s.lr = 0.02;
  s.weight_decay = 0.1;
  s.grad_multiplier = 0.25f;
  muon_step_cpu(h, m, s);
  EXPECT_TRUE(testing::same_bits(plain.param, scaled.param));
  EXPECT_TRUE(testing::same_bits(plain.momentum, scaled.momentum));
}

// muon_step_cpu as one function, as it was before the owner and element
// parts were split (single-threaded: it was thread-count independent).
void monolithic_step(const MuonHyper& h, float* param, float* momentum, const float* grad, int64_t rows,
                     int64_t cols, double lr, double wd, float mult) {
  auto lerp = [](float start, float end, float w) {
    const float diff = end - start;
    return std::fabs(w) < 0.5f ? std::fma(w, diff, start) : std::fma(w - 1.0f, diff, end);
  };
  const int64_t n = rows * cols;
  std::vector<float> update(static_cast<size_t>(n));
  const float w_buf = static_cast<float>(1.0 - h.momentum), w_nesterov = static_cast<float>(h.momentum);
  for (int64_t i = 0; i < n; ++i) {
    const float g = mult == 1.0f ? grad[i] : grad[i] * mult;
    const float m = lerp(momentum[i], g, w_buf);
    momentum[i] = m;
    if (h.nesterov) update[static_cast<size_t>(i)] = lerp(g, m, w_nesterov);
  }
  NewtonSchulzOptions o;
  o.a = h.ns_a;
  o.b = h.ns_b;
  o.c = h.ns_c;
  o.steps = h.ns_steps;
  o.eps = h.eps;
  o.dtype = h.iteration_dtype;
  o.threads = 1;
  newton_schulz_cpu(h.nesterov ? update.data() : momentum, update.data(), rows, cols, o);
  const float alpha = static_cast<float>(-muon_adjusted_lr(lr, h.adjust_lr, rows, cols));
  const float decay = static_cast<float>(1.0 - lr * wd);
  for (int64_t i = 0; i < n; ++i) param[i] = std::fma(update[static_cast<size_t>(i)], alpha, param[i] * decay);
}

// The momentum part in slices, the owner's Newton-Schulz on the whole U,
// then the element part in slices, as the engine runs them on shards, is
// bitwise the step as one function, and so is muon_step_cpu.
TEST(Muon, OwnerAndElementPartsComposeToTheStep) {
  for (const bool nesterov : {true, false}) {
    MuonHyper h;
    h.nesterov = nesterov;
    const int64_t rows = 29, cols = 41, n = rows * cols;
    std::vector<float> p_ref = testing::random_values(static_cast<size_t>(n), 7, 0.05f), m_ref(static_cast<size_t>(n), 0.0f);
    std::vector<float> p_step = p_ref, m_step = m_ref, p_parts = p_ref, m_parts = m_ref;
    std::vector<float> o(static_cast<size_t>(n));
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> g = testing::random_values(static_cast<size_t>(n), 20 + static_cast<uint32_t>(step));
      monolithic_step(h, p_ref.data(), m_ref.data(), g.data(), rows, cols, 0.02, 0.1, 0.75f);
      MuonMatrix x{.param = p_step.data(), .momentum = m_step.data(), .grad = g.data(), .rows = rows, .cols = cols};
      MuonStep s;
      s.lr = 0.02;
      s.weight_decay = 0.1;
      s.grad_multiplier = 0.75f;
      muon_step_cpu(h, x, s);
      const MuonMomentum mc = muon_momentum_constants(h);
      std::vector<float> u(static_cast<size_t>(n));
      for (int64_t b = 0; b < n; b += 333) {  // shard-like slices
        for (int64_t i = b; i < std::min<int64_t>(b + 333, n); ++i) {
          const auto k = static_cast<size_t>(i);
          u[k] = muon_momentum_element(m_parts[k], g[k] * 0.75f, mc);
        }
      }
      muon_orthogonalize_cpu(h, u.data(), rows, cols, o.data(), 2);
      const MuonApply c = muon_apply_constants(h, 0.02, 0.1, rows, cols);
      for (int64_t b = 0; b < n; b += 333) {
        muon_apply_cpu(p_parts.data() + b, o.data() + b, std::min<int64_t>(333, n - b), c, 1);
      }
    }
    EXPECT_TRUE(testing::same_bits(p_ref, p_step));
    EXPECT_TRUE(testing::same_bits(m_ref, m_step));
    EXPECT_TRUE(testing::same_bits(p_ref, p_parts));
    EXPECT_TRUE(testing::same_bits(m_ref, m_parts));
  }
}

// Note [Muon owners]: largest first, each to the least loaded rank.
TEST(Muon, OwnersBalanceTheFlopsDeterministically) {
  EXPECT_EQ(muon_ns_flops(16, 48, 5), 5.0 * (4.0 * 16 * 16 * 48 + 2.0 * 16 * 16 * 16));
  EXPECT_EQ(muon_ns_flops(48, 16, 5), muon_ns_flops(16, 48, 5));
  const std::vector<double> flops = {5, 8, 3, 8, 1, 4};
  EXPECT_EQ(assign_muon_owners(flops, 1), (std::vector<int>{0, 0, 0, 0, 0, 0}));
  // 8 (index 1) -> 0, 8 (3) -> 1, 5 (0) -> 2, 4 (5) -> 2 (load 5 < 8), 3 (2) -> 0, 1 (4) -> 1.
  EXPECT_EQ(assign_muon_owners(flops, 3), (std::vector<int>{2, 0, 0, 1, 1, 2}));
  EXPECT_EQ(assign_muon_owners(flops, 3), assign_muon_owners(flops, 3));
  // More ranks than matrices: the extra ranks own nothing.
  EXPECT_EQ(assign_muon_owners({2, 1}, 4), (std::vector<int>{0, 1}));
  // A GPT's matrices over 4 ranks: no rank above 1.35x the mean.
  std::vector<double> gpt;
  for (int l = 0; l < 12; ++l) {
    for (const auto& [r, c] : std::vector<std::pair<int64_t, int64_t>>{{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}}) {
      gpt.push_back(muon_ns_flops(r, c, 5));
    }
  }
  std::vector<double> load(4, 0.0);
  const std::vector<int> owners = assign_muon_owners(gpt, 4);
  double total = 0;
  for (size_t i = 0; i < gpt.size(); ++i) {
    load[static_cast<size_t>(owners[i])] += gpt[i];
    total += gpt[i];
  }
  for (const double l : load) EXPECT_LT(l, 1.05 * total / 4);
  EXPECT_THROW(assign_muon_owners(flops, 0), EnforceError);
}

// Note [Muon and the GPT]: the GPT's model spec marks the blocks' 2-D
// weights, each with its lr shape (out, in) = (shape[1], shape[0]): c_fc's
// fan-out, as nn.Linear's [out, in] would be read; nothing else.
TEST(Muon, GptSpecMarksTheBlocksMatrices) {
  const ModelSpec spec = Gpt::spec_for(testing::small_gpt());
  const std::regex in_block(R"(h[0-9]+\..+)");
  std::vector<std::string> marked;
  for (const UnitSpec& u : spec.units) {
    for (const ParamSpec& p : u.params) {
      const bool matrix = p.shape.size() == 2 && std::regex_match(p.name, in_block);
      EXPECT_EQ(p.muon, matrix) << p.name;
      if (!p.muon) continue;
      marked.push_back(p.name);
      EXPECT_EQ(p.muon_lr_a, p.shape[1]) << p.name;
      EXPECT_EQ(p.muon_lr_b, p.shape[0]) << p.name;
    }
  }
  EXPECT_EQ(marked.size(), 8u);
  EXPECT_EQ(marked[0], "h0.attn.c_attn.weight");
  for (const char* name : {"h0.attn.c_proj.weight", "h0.mlp.c_fc.weight", "h1.mlp.c_proj.weight"}) {
    EXPECT_NE(std::find(marked.begin(), marked.end(), name), marked.end()) << name;
  }
}

TEST(Muon, BadArgumentsAreRefused) {
  MuonHyper h;
  std::vector<float> p(12, 0.0f), m(12, 0.0f), g(12, 1.0f);
  MuonMatrix x{.param = p.data(), .momentum = m.data(), .grad = g.data(), .rows = 3, .cols = 4};
  MuonStep s;
  s.lr = 0.02;
  std::vector<float> scratch(4);
  s.scratch = scratch.data();
  s.scratch_elements = 4;
  EXPECT_TRUE(testing::contains(testing::error_of<EnforceError>([&] { muon_step_cpu(h, x, s); }), "scratch of 4"));
  s.scratch = nullptr;
  x.lr_a = 3;
  EXPECT_TRUE(testing::contains(testing::error_of<EnforceError>([&] { muon_step_cpu(h, x, s); }), "both or neither"));
  x.lr_a = 0;
  x.grad = nullptr;
  EXPECT_TRUE(testing::contains(testing::error_of<EnforceError>([&] { muon_step_cpu(h, x, s); }), "null"));
}

// ---- against torch.optim.Muon ------------------------------------------------------

struct GoldenMatrix {
  std::string name;
  int64_t rows = 0, cols = 0;
  std::vector<double> param;
  std::vector<std::vector<double>> grads;
};

struct GoldenRun {
  std::string setting;
  std::string iteration;  // "bfloat16" or "float64"
  MuonHyper hyper;
  double lr = 0, wd = 0;
  std::vector<std::vector<double>> param, momentum;  // per matrix
};

struct Golden {
  std::vector<GoldenMatrix> matrices;
  std::vector<GoldenRun> runs;
};

MuonAdjustLr adjust_of(const std::string& s) {
  if (s == "original") return MuonAdjustLr::kOriginal;
  if (s == "match_rms_adamw") return MuonAdjustLr::kMatchRmsAdamW;
  if (s == "spectral_unclamped") return MuonAdjustLr::kSpectralUnclamped;
  throw std::runtime_error("unknown adjust_lr_fn " + s);
}

const Golden& golden() {
  static const Golden g = [] {
    const std::string path = std::string(MP_TEST_GOLDEN_DIR) + "/muon_torch.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    const nlohmann::json j = nlohmann::json::parse(in);
    Golden out;
    for (const nlohmann::json& m : j.at("matrices")) {
      GoldenMatrix gm;
      gm.name = m.at("name").get<std::string>();
      const auto shape = m.at("shape").get<std::vector<int64_t>>();
      gm.rows = shape.at(0);
      gm.cols = shape.at(1);
      gm.param = m.at("param").get<std::vector<double>>();
      gm.grads = m.at("grads").get<std::vector<std::vector<double>>>();
      out.matrices.push_back(std::move(gm));
    }
    for (const nlohmann::json& r : j.at("runs")) {
      GoldenRun gr;
      const nlohmann::json& s = r.at("setting");
      gr.setting = s.at("name").get<std::string>();
      gr.iteration = r.at("iteration").get<std::string>();
      gr.lr = s.at("lr").get<double>();
      gr.wd = s.at("weight_decay").get<double>();
      gr.hyper.momentum = s.at("momentum").get<double>();
      gr.hyper.nesterov = s.at("nesterov").get<bool>();
      const auto coefficients = s.at("ns_coefficients").get<std::vector<double>>();
      gr.hyper.ns_a = coefficients.at(0);
      gr.hyper.ns_b = coefficients.at(1);
      gr.hyper.ns_c = coefficients.at(2);
      gr.hyper.ns_steps = s.at("ns_steps").get<int>();
      gr.hyper.eps = s.at("eps").get<double>();
      gr.hyper.adjust_lr = adjust_of(s.at("adjust_lr_fn").get<std::string>());
      gr.hyper.iteration_dtype = gr.iteration == "bfloat16" ? DType::kBF16 : DType::kF32;
      for (const nlohmann::json& res : r.at("results")) {
        gr.param.push_back(res.at("param").get<std::vector<double>>());
        gr.momentum.push_back(res.at("momentum_buffer").get<std::vector<double>>());
      }
      out.runs.push_back(std::move(gr));
    }
    return out;
  }();
  return g;
}

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// torch's float64 run (its own step, its Newton-Schulz in float64) is the
// float64 reference of tests/muon_reference.h to rounding: the reference's
// formulas are torch's. The library's fp32 iteration is within the bound of
// Note [Muon step tolerances] of it.
TEST(MuonTorch, Float64RunsAgreeWithTheReferenceAndTheFp32Iteration) {
  int checked = 0;
  for (const GoldenRun& run : golden().runs) {
    if (run.iteration != "float64") continue;
    for (size_t k = 0; k < golden().matrices.size(); ++k) {
      const GoldenMatrix& gm = golden().matrices[k];
      const std::string what = run.setting + " " + gm.name;
      const testing::MuonReferenceRun ref = testing::muon_reference_run(
          run.hyper, gm.rows, gm.cols, gm.rows, gm.cols, gm.param, gm.grads, run.lr, run.wd);
      EXPECT_LE(ref_distance(ref.param, run.param[k]), 1e-12 * testing::ref_norm(ref.param)) << what;
      EXPECT_LE(ref_distance(ref.momentum, run.momentum[k]), 1e-12 * testing::ref_norm(ref.momentum)) << what;

      std::vector<std::vector<float>> grads;
      for (const auto& g : gm.grads) grads.push_back(to_float(g));
      const StepsResult mp = run_steps(run.hyper, gm.rows, gm.cols, to_float(gm.param), grads, run.lr, run.wd);
      const double dp = ref_distance(testing::to_double(mp.param), run.param[k]);
      EXPECT_LE(dp, ref.param_bound) << what;
      EXPECT_LE(ref_distance(testing::to_double(mp.momentum), run.momentum[k]), ref.momentum_bound) << what;
      RecordProperty("fp32 vs torch float64 " + what, sci(dp) + " (bound " + sci(ref.param_bound) + ")");
      ++checked;
    }
  }
  EXPECT_EQ(checked, 9);
}

// torch.optim.Muon as it is (bf16 Newton-Schulz): the momentum buffers
// (fp32 lerps, no Newton-Schulz in them) are torch's bits; torch's
// parameters and the library's are each within the bf16 bound of the float64
// reference (Note [Muon step tolerances]), so within twice it of each other.
TEST(MuonTorch, Bf16RunsGiveTorchsMomentumBitsAndItsParameters) {
  int checked = 0;
  for (const GoldenRun& run : golden().runs) {
    if (run.iteration != "bfloat16") continue;
    for (size_t k = 0; k < golden().matrices.size(); ++k) {
      const GoldenMatrix& gm = golden().matrices[k];
      const std::string what = run.setting + " " + gm.name;
      std::vector<std::vector<float>> grads;
      for (const auto& g : gm.grads) grads.push_back(to_float(g));
      const StepsResult mp = run_steps(run.hyper, gm.rows, gm.cols, to_float(gm.param), grads, run.lr, run.wd);
      EXPECT_TRUE(testing::same_bits(mp.momentum, to_float(run.momentum[k]))) << what;

      const testing::MuonReferenceRun ref = testing::muon_reference_run(
          run.hyper, gm.rows, gm.cols, gm.rows, gm.cols, gm.param, gm.grads, run.lr, run.wd);
      const std::vector<float> torch_param = to_float(run.param[k]);  // the JSON holds fp32 values
      const double torch_err = ref_distance(testing::to_double(torch_param), ref.param);
      const double mp_err = ref_distance(testing::to_double(mp.param), ref.param);
      const double between = ref_distance(testing::to_double(mp.param), testing::to_double(torch_param));
      EXPECT_LE(torch_err, ref.param_bound) << what << ": torch itself outside the model's bound";
      EXPECT_LE(mp_err, ref.param_bound) << what;
      EXPECT_LE(between, 2 * ref.param_bound) << what;
      size_t same = 0;
      for (size_t i = 0; i < torch_param.size(); ++i) same += std::memcmp(&mp.param[i], &torch_param[i], 4) == 0;
      RecordProperty("bf16 vs torch " + what,
                     sci(between) + " (" + std::to_string(same) + " of " + std::to_string(torch_param.size()) +
                         " elements the same bits; torch " + sci(torch_err) + ", mp " + sci(mp_err) +
                         " from float64; bound " + sci(ref.param_bound) + ")");
      ++checked;
    }
  }
  EXPECT_EQ(checked, 9);
}

}  // namespace
}  // namespace mp

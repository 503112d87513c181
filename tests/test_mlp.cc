// The MLP model: double-precision gradients against finite differences, the
// fp32 model against the double path, narrow parameters, determinism across
// runs and thread counts, untouched gaps, config errors, and learnable data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "models/flat_layout.h"
#include "models/mlp.h"
#include "tests/model_test_util.h"

namespace mp {
namespace {

using namespace mp::testing;  // NOLINT(build/namespaces)

double double_loss(const MlpConfig& c, const std::vector<float>& x, const std::vector<int32_t>& labels,
                   const Units64& params, Units64& grads) {
  return mlp_loss_and_grads<double>(c, x.data(), labels.data(), params, grads);
}

TEST(Mlp, DoubleGradientsMatchFiniteDifferences) {
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{5, 7, 3}, std::vector<int64_t>{5, 7, 6, 3}}) {
    const MlpConfig c = mlp_config(dims, 4);
    const FlatLayout layout(Mlp::spec_for(c), 1);
    std::vector<float> x(static_cast<size_t>(4 * dims[0]));
    std::vector<int32_t> labels(4);
    MlpData(c).micro_batch(2, x.data(), labels.data());
    Units64 p = to_double(init_params(layout, 11, 1.0f, 0.3f));
    Units64 grads, scratch;
    double_loss(c, x, labels, p, grads);
    const FdErrors errors = expect_gradients_match_finite_differences(
        layout, p, grads, 1e-2, [&](const Units64& q) { return double_loss(c, x, labels, q, scratch); });
    RecordProperty("max_abs_err_layers_" + std::to_string(dims.size() - 1), sci(errors.max_abs));
  }
}

TEST(Mlp, Fp32ModelMatchesDoublePath) {
  const MlpConfig c = mlp_config({16, 32, 32, 10}, 8, 2);
  const FlatLayout layout(Mlp::spec_for(c), 1);
  Units32 p32 = init_params(layout, 5, 1.0f, 0.1f);
  const Units64 p64 = to_double(p32);
  Units32 g32 = p32;  // same sizes
  const std::vector<Tensor> params = wrap_units(p32), grads = wrap_units(g32);
  Mlp model(c);
  for (int64_t g : {0, 3, 1000}) {
    const double loss32 = run_model(model, g, params, grads);
    std::vector<float> x(model.inputs(), model.inputs() + 8 * 16);
    std::vector<int32_t> labels(model.labels(), model.labels() + 8);
    Units64 g64;
    const double loss64 = double_loss(c, x, labels, p64, g64);
    EXPECT_NEAR(loss32, loss64, 1e-6 * loss64) << "micro-batch " << g;
    for (size_t u = 0; u < p32.size(); ++u) {
      for (const ParamPlacement& pp : layout.unit(static_cast<int>(u)).params) {
        // Tolerance relative to the parameter's largest gradient: single
        // elements can cancel to near zero in any precision.
        const double scale = max_abs(g64[u], pp);
        for (int64_t i = pp.offset; i < pp.offset + pp.numel; ++i) {
          const auto k = static_cast<size_t>(i);
          EXPECT_NEAR(g32[u][k], g64[u][k], 1e-5 * scale)
              << pp.name << "[" << i - pp.offset << "] micro-batch " << g;
        }
      }
    }
  }
}

TEST(Mlp, NarrowParamsEqualFp32OfTheRoundedValues) {
  const MlpConfig c = mlp_config({16, 24, 10}, 8, 2);
  const FlatLayout layout(Mlp::spec_for(c), 1);
  Allocator alloc;
  const Units32 p32 = init_params(layout, 7, 1.0f, 0.1f);
  for (DType narrow : {DType::kBF16, DType::kF16}) {
    const auto [narrow_params, rounded_params, narrow_grads, rounded_grads] = narrow_and_rounded(alloc, p32, narrow);
    Mlp a(c), b(c);
    const double loss_narrow = run_model(a, 4, narrow_params, narrow_grads);
    const double loss_rounded = run_model(b, 4, rounded_params, rounded_grads);
    EXPECT_EQ(std::memcmp(&loss_narrow, &loss_rounded, sizeof(double)), 0) << dtype_name(narrow);
    for (size_t u = 0; u < p32.size(); ++u) {
      EXPECT_EQ(std::memcmp(narrow_grads[u].data(), rounded_grads[u].data(), narrow_grads[u].size_bytes()), 0)
          << dtype_name(narrow) << " unit " << u;
    }
  }
}

// Every gradient buffer after micro-batch g of `c` (run `repeats` times, the
// loss checked for equal bits), grads pre-filled with 7.
Units32 grads_bits(const MlpConfig& c, const Units32& p, int64_t g, int repeats, Allocator alloc) {
  Units32 params = p;
  Units32 grads;
  for (const std::vector<float>& unit : params) grads.emplace_back(unit.size(), 7.0f);
  const std::vector<Tensor> pt = wrap_units(params), gt = wrap_units(grads);
  Mlp model(c, alloc);
  const size_t allocations = alloc.stats().total_allocations;
  double first_loss = 0.0;
  for (int r = 0; r < repeats; ++r) {
    const double loss = run_model(model, g, pt, gt);
    if (r == 0) first_loss = loss;
    EXPECT_EQ(std::memcmp(&loss, &first_loss, sizeof(double)), 0) << "repeat " << r;
  }
  EXPECT_EQ(alloc.stats().total_allocations, allocations) << "forward/backward allocated";
  EXPECT_GT(alloc.stats().current(MemCategory::kActivations), size_t{0});
  return grads;
}

TEST(Mlp, DeterministicAcrossRepeatsAndThreadsAndLeavesGapsAlone) {
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{6, 9, 5, 4}, std::vector<int64_t>{21, 300, 45, 10}}) {
    const MlpConfig c1 = mlp_config(dims, 5, 1);
    const FlatLayout layout(Mlp::spec_for(c1), 3);
    const Units32 p = init_params(layout, 9, 1.0f, 0.1f, 7.0f);  // gaps hold 7 in params too
    const auto ref = grads_bits(c1, p, 6, 2, Allocator());
    for (int threads : {2, 3}) {
      const auto got = grads_bits(mlp_config(dims, 5, threads), p, 6, 1, Allocator());
      for (size_t u = 0; u < ref.size(); ++u) {
        EXPECT_EQ(std::memcmp(got[u].data(), ref[u].data(), ref[u].size() * sizeof(float)), 0)
            << "unit " << u << " threads " << threads;
      }
    }
    for (size_t u = 0; u < ref.size(); ++u) {
      const UnitLayout& unit = layout.unit(static_cast<int>(u));
      const std::vector<bool> covered = param_elements(unit);
      int64_t gaps = 0;
      for (int64_t i = 0; i < unit.padded_numel; ++i) {
        const auto k = static_cast<size_t>(i);
        if (covered[k]) {
          EXPECT_NE(ref[u][k], 7.0f) << unit.name << " element " << i << " not written";
        } else {
          ++gaps;
          EXPECT_EQ(ref[u][k], 7.0f) << unit.name << " gap element " << i << " written";
        }
      }
      EXPECT_GT(gaps, 0) << unit.name;  // the shapes are chosen to have gaps and padding
    }
  }
}

TEST(Mlp, DataIsAPureFunctionOfTheIndex) {
  const MlpConfig c = mlp_config({12, 8, 6}, 64);
  const MlpData a(c), b(c);
  std::vector<float> xa(64 * 12), xb(64 * 12), xc(64 * 12);
  std::vector<int32_t> la(64), lb(64), lc(64);
  a.micro_batch(17, xa.data(), la.data());
  b.micro_batch(17, xb.data(), lb.data());
  a.micro_batch(18, xc.data(), lc.data());
  EXPECT_EQ(std::memcmp(xa.data(), xb.data(), xa.size() * sizeof(float)), 0);
  EXPECT_EQ(la, lb);
  EXPECT_NE(xa, xc);
  for (float v : xa) {
    EXPECT_GE(v, -1.0f);
    EXPECT_LT(v, 1.0f);
  }
  std::set<int32_t> classes(la.begin(), la.end());
  for (int32_t l : la) {
    EXPECT_GE(l, 0);
    EXPECT_LT(l, 6);
  }
  EXPECT_GE(classes.size(), size_t{3}) << "the teacher gives almost one class";
  EXPECT_THROW(a.micro_batch(-1, xa.data(), la.data()), EnforceError);
}

TEST(Mlp, ConfigErrorsNameTheField) {
  expect_config_error<Mlp>(mlp_config({4}, 8), "mlp.dims has 1 entries: need at least 2");
  expect_config_error<Mlp>(mlp_config({}, 8), "mlp.dims has 0 entries");
  expect_config_error<Mlp>(mlp_config({4, 5, 0, 2}, 8), "mlp.dims[2] = 0: must be positive");
  expect_config_error<Mlp>(mlp_config({-3, 2}, 8), "mlp.dims[0] = -3: must be positive");
  expect_config_error<Mlp>(mlp_config({4, 2}, 0), "mlp.micro_batch_size = 0: must be positive");
  expect_config_error<Mlp>(mlp_config({4, 2}, 8, -1), "mlp.threads = -1: must be 0 (default) or positive");
  EXPECT_THROW(Mlp::spec_for(mlp_config({4, 0}, 8)), ConfigError);
}

TEST(Mlp, SpecNamesShapesAndInit) {
  const ModelSpec spec = Mlp::spec_for(mlp_config({16, 32, 10}, 8));
  ASSERT_EQ(spec.units.size(), size_t{2});
  EXPECT_EQ(spec.units[1].name, "layer1");
  ASSERT_EQ(spec.units[1].params.size(), size_t{2});
  EXPECT_EQ(spec.units[1].params[0].name, "layer1.weight");
  EXPECT_EQ(spec.units[1].params[0].shape, (Shape{10, 32}));
  EXPECT_EQ(spec.units[1].params[0].init.kind, ParamInit::Kind::kNormal);
  EXPECT_DOUBLE_EQ(spec.units[1].params[0].init.scale, 1.0 / std::sqrt(32.0));
  EXPECT_EQ(spec.units[1].params[1].name, "layer1.bias");
  EXPECT_EQ(spec.units[1].params[1].shape, (Shape{10}));
  EXPECT_EQ(spec.units[1].params[1].init.kind, ParamInit::Kind::kZeros);
  EXPECT_EQ(spec.numel(), 16 * 32 + 32 + 32 * 10 + 10);
}

TEST(Mlp, SgdOnTeacherLabelsLowersTheLoss) {
  const MlpConfig c = mlp_config({16, 32, 32, 10}, 8, 1);
  const FlatLayout layout(Mlp::spec_for(c), 1);
  Units32 p = init_params(layout, 3, 1.0f, 0.0f);
  Units32 g = p;
  const std::vector<Tensor> pt = wrap_units(p), gt = wrap_units(g);
  Mlp model(c);
  // Held-out micro-batches, never trained on.
  auto eval = [&] {
    double sum = 0.0;
    for (int64_t k = 0; k < 16; ++k) sum += run_model(model, 1'000'000 + k, pt, gt);
    return sum / 16;
  };
  const double initial = eval();
  const float lr = 0.2f;
  const int steps = 400;
  for (int64_t s = 0; s < steps; ++s) {
    run_model(model, s, pt, gt);
    for (size_t u = 0; u < p.size(); ++u) {
      for (size_t i = 0; i < p[u].size(); ++i) p[u][i] -= lr * g[u][i];
    }
  }
  const double trained = eval();
  RecordProperty("initial_loss", std::to_string(initial));
  RecordProperty("trained_loss", std::to_string(trained));
  EXPECT_LT(trained, 0.6 * initial) << "initial " << initial << ", after " << steps << " steps " << trained;
}

}  // namespace
}  // namespace mp

namespace mp::testing {
namespace {

TEST(Mlp, ActivationBytesAreWhatTheModelAllocates) {
  const MlpConfig c = small_mlp(5);
  Allocator alloc;
  const Mlp mlp(c, alloc);
  EXPECT_EQ(static_cast<int64_t>(alloc.stats().current_bytes[static_cast<size_t>(MemCategory::kActivations)]),
            Mlp::activation_bytes(c));
}

}  // namespace
}  // namespace mp::testing

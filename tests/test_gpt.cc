// The GPT model (models/gpt.h): the whole model's gradients (double)
// against central finite differences, the fp32 model against the double
// path, narrow parameters, determinism across runs and thread counts,
// untouched gaps, no allocations per call, config errors, the padded
// vocabulary, the data, and a short training run.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "kernels/op_profile.h"
#include "models/gpt_sample.h"
#include "tests/gpt_test_ops.h"
#include "tests/gpt_test_util.h"

namespace mp {
namespace {

using namespace mp::testing;  // NOLINT(build/namespaces)

TEST(Gpt, DoubleGradientsMatchFiniteDifferences) {
  const GptConfig c = gpt_config(11, 5, 8, 2, 2, 2);
  const FlatLayout layout(Gpt::spec_for(c), 1);
  const Batch data = load(c, 3);
  // Larger weights than the init, so attention and gelu are far from linear.
  Units64 p = to_double(init_params(layout, 21, 10.0f, 0.2f));
  Units64 grads, scratch;
  gpt_loss_and_grads<double>(c, data.inputs.data(), data.targets.data(), p, grads);
  const FdErrors errors = expect_gradients_match_finite_differences(layout, p, grads, 1e-3, [&](const Units64& q) {
    return gpt_loss_and_grads<double>(c, data.inputs.data(), data.targets.data(), q, scratch);
  });
  RecordProperty("max_rel_err", sci(errors.max_rel));
}

TEST(Gpt, Fp32ModelMatchesDoublePath) {
  const GptConfig c = gpt_config(64, 16, 32, 4, 2, 2, 2);
  const FlatLayout layout(Gpt::spec_for(c), 1);
  Units32 p32 = init_params(layout, 5, 1.0f, 0.1f);
  const Units64 p64 = to_double(p32);
  Units32 g32 = p32;  // same sizes
  const std::vector<Tensor> params = wrap_units(p32), grads = wrap_units(g32);
  Gpt model(c);
  double max_loss_rel = 0.0, max_grad_rel = 0.0;
  for (int64_t g : {0, 3, 1000}) {
    const double loss32 = run_model(model, g, params, grads);
    const Batch data = load(c, g);
    ASSERT_EQ(std::vector<int32_t>(model.inputs(), model.inputs() + data.inputs.size()), data.inputs);
    ASSERT_EQ(std::vector<int32_t>(model.targets(), model.targets() + data.targets.size()), data.targets);
    Units64 g64;
    const double loss64 = gpt_loss_and_grads<double>(c, data.inputs.data(), data.targets.data(), p64, g64);
    max_loss_rel = std::max(max_loss_rel, std::abs(loss32 - loss64) / loss64);
    EXPECT_NEAR(loss32, loss64, 1e-6 * loss64) << "micro-batch " << g;
    // The Model and the float whole-model path run the same unit code.
    Units32 gf;
    const double lossf = gpt_loss_and_grads<float>(c, data.inputs.data(), data.targets.data(), p32, gf);
    EXPECT_EQ(std::memcmp(&lossf, &loss32, sizeof(double)), 0) << "micro-batch " << g;
    for (size_t u = 0; u < p32.size(); ++u) {
      for (const ParamPlacement& pp : layout.unit(static_cast<int>(u)).params) {
        // Tolerance relative to the parameter's largest gradient: single
        // elements can cancel to near zero in any precision.
        const double scale = max_abs(g64[u], pp);
        ASSERT_GT(scale, 0.0) << pp.name;
        for (int64_t i = pp.offset; i < pp.offset + pp.numel; ++i) {
          const auto k = static_cast<size_t>(i);
          max_grad_rel = std::max(max_grad_rel, std::abs(g32[u][k] - g64[u][k]) / scale);
          EXPECT_NEAR(g32[u][k], g64[u][k], 1e-5 * scale) << pp.name << "[" << i - pp.offset << "] micro-batch " << g;
          EXPECT_EQ(gf[u][k], g32[u][k]) << pp.name << "[" << i - pp.offset << "] micro-batch " << g;
        }
      }
    }
  }
  RecordProperty("max_loss_rel_err", sci(max_loss_rel));
  RecordProperty("max_grad_rel_err", sci(max_grad_rel));
}

TEST(Gpt, NarrowParamsEqualFp32OfTheRoundedValues) {
  // With bf16 GEMMs too: bf16 weights go to the GEMMs as they are (Note [GPT
  // autocast]), fp32 weights are rounded first; the same values, the same bits.
  for (DType matmul : {DType::kF32, DType::kBF16}) {
  GptConfig c = gpt_config(50, 8, 24, 3, 2, 2, 2);
  c.matmul_dtype = matmul;
  const FlatLayout layout(Gpt::spec_for(c), 1);
  Allocator alloc;
  const Units32 p32 = init_params(layout, 7, 1.0f, 0.1f);
  for (DType narrow : {DType::kBF16, DType::kF16}) {
    const auto [narrow_params, rounded_params, narrow_grads, rounded_grads] = narrow_and_rounded(alloc, p32, narrow);
    Gpt a(c), b(c);
    const double loss_narrow = run_model(a, 4, narrow_params, narrow_grads);
    const double loss_rounded = run_model(b, 4, rounded_params, rounded_grads);
    EXPECT_EQ(std::memcmp(&loss_narrow, &loss_rounded, sizeof(double)), 0)
        << dtype_name(narrow) << " params, " << dtype_name(matmul) << " GEMMs";
    for (size_t u = 0; u < p32.size(); ++u) {
      EXPECT_EQ(std::memcmp(narrow_grads[u].data(), rounded_grads[u].data(), narrow_grads[u].size_bytes()), 0)
          << dtype_name(narrow) << " params, " << dtype_name(matmul) << " GEMMs, unit " << u;
    }
  }
  }
}

// Every gradient buffer after micro-batch g of `c` (run `repeats` times, the
// loss and grads checked for equal bits), grads pre-filled with 7; no
// allocation after construction.
Units32 grads_bits(const GptConfig& c, const Units32& p, int64_t g, int repeats) {
  Allocator alloc;
  Units32 params = p;
  Units32 grads, first;
  for (const std::vector<float>& unit : params) grads.emplace_back(unit.size(), 7.0f);
  const std::vector<Tensor> pt = wrap_units(params), gt = wrap_units(grads);
  Gpt model(c, alloc);
  const size_t allocations = alloc.stats().total_allocations;
  double first_loss = 0.0;
  for (int r = 0; r < repeats; ++r) {
    const double loss = run_model(model, g, pt, gt);
    if (r == 0) {
      first_loss = loss;
      first = grads;
    }
    EXPECT_EQ(std::memcmp(&loss, &first_loss, sizeof(double)), 0) << "repeat " << r;
    EXPECT_EQ(grads, first) << "repeat " << r;
    run_model(model, g + 1, pt, gt);  // a different micro-batch in between
  }
  run_model(model, g, pt, gt);
  EXPECT_EQ(alloc.stats().total_allocations, allocations) << "forward/backward allocated";
  EXPECT_GT(alloc.stats().current(MemCategory::kActivations), size_t{0});
  return grads;
}

TEST(Gpt, DeterministicAcrossRepeatsAndThreadsAndLeavesGapsAlone) {
  // The second config is large enough that every op loop splits across
  // threads (the layer ops give each thread at least 2^14 multiply-adds);
  // odd channel counts leave alignment gaps, group size 3 adds padding.
  // Both GEMM precisions (Note [GPT autocast]): the GEMMs' tiles do not
  // depend on the thread count either (Note [CPU GEMM threads]).
  GptConfig bf16 = gpt_config(300, 64, 100, 4, 2, 4);
  bf16.matmul_dtype = DType::kBF16;
  for (const GptConfig& c1 : {gpt_config(11, 7, 12, 3, 2, 3), gpt_config(300, 64, 100, 4, 2, 4), bf16}) {
    const FlatLayout layout(Gpt::spec_for(c1), 3);
    const Units32 p = init_params(layout, 9, 1.0f, 0.1f, 7.0f);  // gaps hold 7 in params too
    const auto ref = grads_bits(c1, p, 6, 2);
    for (int threads : {2, 3}) {
      GptConfig ct = c1;
      ct.threads = threads;
      const auto got = grads_bits(ct, p, 6, 1);
      for (size_t u = 0; u < ref.size(); ++u) {
        EXPECT_EQ(std::memcmp(got[u].data(), ref[u].data(), ref[u].size() * sizeof(float)), 0)
            << "unit " << u << " threads " << threads << " channels " << c1.channels << " "
            << dtype_name(c1.matmul_dtype) << " GEMMs";
      }
    }
    int64_t gaps = 0;
    for (size_t u = 0; u < ref.size(); ++u) {
      const UnitLayout& unit = layout.unit(static_cast<int>(u));
      const std::vector<bool> covered = param_elements(unit);
      int64_t written = 0, params = 0;
      for (int64_t i = 0; i < unit.padded_numel; ++i) {
        const auto k = static_cast<size_t>(i);
        if (covered[k]) {
          ++params;
          written += ref[u][k] != 7.0f;
        } else {
          ++gaps;
          EXPECT_EQ(ref[u][k], 7.0f) << unit.name << " gap element " << i << " written";
        }
      }
      // Every parameter element is overwritten (a gradient of exactly 7 would be a fluke).
      EXPECT_EQ(written, params) << unit.name;
    }
    EXPECT_GT(gaps, 0) << "channels " << c1.channels;  // the shapes are chosen to have gaps and padding
  }
}

TEST(Gpt, TiedHeadNeedsNoEmbeddingParamsAfterForwardZero) {
  // Note [Tied head]: with FULL_SHARD the engine releases unit 0's gathered
  // buffer after forward(0); the head and backward(0) must not read it.
  for (DType matmul : {DType::kF32, DType::kBF16}) {  // a bf16 head keeps its own rounded wte
  GptConfig c = small_gpt(40);
  c.matmul_dtype = matmul;
  const FlatLayout layout(Gpt::spec_for(c), 1);
  Units32 p = init_params(layout, 13, 1.0f, 0.1f);
  Units32 g_ref = p, g_released = p;
  const std::vector<Tensor> pt = wrap_units(p), gt_ref = wrap_units(g_ref), gt_released = wrap_units(g_released);
  Gpt model(c);
  const double loss_ref = run_model(model, 5, pt, gt_ref);
  std::vector<float> released = p[0];
  const Tensor released_t = wrap(released);
  model.begin_micro_batch(5);
  model.forward(0, released_t);
  std::fill(released.begin(), released.end(), std::nanf(""));  // "released" and reused
  const int units = layout.num_units();
  for (int u = 1; u < units; ++u) model.forward(u, pt[static_cast<size_t>(u)]);
  const double loss = model.loss();
  for (int u = units - 1; u >= 1; --u) {
    model.backward(u, pt[static_cast<size_t>(u)], gt_released[static_cast<size_t>(u)]);
  }
  model.backward(0, released_t, gt_released[0]);
  EXPECT_EQ(std::memcmp(&loss, &loss_ref, sizeof(double)), 0) << dtype_name(matmul);
  for (size_t u = 0; u < p.size(); ++u) EXPECT_EQ(g_released[u], g_ref[u]) << "unit " << u << " " << dtype_name(matmul);
  }
}

// Note [Tied head]: where the engine keeps every unit's parameters
// (set_params_persist), the head reads wte in unit 0's buffer instead of a
// copy: the same bits, one op fewer, and a wte changed after forward(0)
// reaches the logits (the proof that it is read in place).
TEST(Gpt, TiedHeadReadsWteInPlaceWhereTheEngineKeepsIt) {
  const GptConfig c = small_gpt(40);  // fp32 head on fp32 parameters: read as they are
  const FlatLayout layout(Gpt::spec_for(c), 1);
  Units32 p = init_params(layout, 13, 1.0f, 0.1f);
  Units32 g_copy = p, g_kept = p;
  const std::vector<Tensor> pt = wrap_units(p), gt_copy = wrap_units(g_copy), gt_kept = wrap_units(g_kept);
  Gpt model(c);
  (void)op_count_take();
  const double loss_copy = run_model(model, 5, pt, gt_copy);
  const OpCount copy_ops = op_count_take();
  model.set_params_persist(true);
  const double loss_kept = run_model(model, 5, pt, gt_kept);
  const OpCount kept_ops = op_count_take();
  EXPECT_EQ(std::memcmp(&loss_copy, &loss_kept, sizeof(double)), 0);
  for (size_t u = 0; u < p.size(); ++u) EXPECT_EQ(g_kept[u], g_copy[u]) << "unit " << u;
  EXPECT_EQ(kept_ops.model, copy_ops.model - 1);
  // wte changed after forward(0): the head sees it.
  std::vector<float> unit0 = p[0];
  model.begin_micro_batch(5);
  model.forward(0, wrap(unit0));
  std::fill(unit0.begin(), unit0.end(), 0.0f);
  for (int u = 1; u < layout.num_units(); ++u) model.forward(u, pt[static_cast<size_t>(u)]);
  EXPECT_NEAR(model.loss(), std::log(static_cast<double>(c.vocab)), 1e-6);  // zero logits: a uniform softmax
}

TEST(Gpt, PaddedVocabularyDoesNotAffectTheLoss) {
  const GptConfig c = gpt_config(11, 6, 16, 2, 1, 2, 1);
  const FlatLayout layout(Gpt::spec_for(c), 1);
  const ParamPlacement& wte = layout.param("wte");
  ASSERT_EQ(wte.shape, (Shape{128, 16}));
  const Batch data = load(c, 2);
  const Units32 p = init_params(layout, 31, 1.0f, 0.1f);
  Units32 q = p;  // large values in the padded rows of wte
  const Vec noise = random_vec(static_cast<size_t>((128 - 11) * 16), 32, 50.0);
  for (size_t i = 0; i < noise.size(); ++i) {
    q[0][static_cast<size_t>(wte.offset + 11 * 16) + i] = static_cast<float>(noise[i]);
  }
  Units32 gp, gq;
  const double lp = gpt_loss_and_grads<float>(c, data.inputs.data(), data.targets.data(), p, gp);
  const double lq = gpt_loss_and_grads<float>(c, data.inputs.data(), data.targets.data(), q, gq);
  EXPECT_EQ(std::memcmp(&lp, &lq, sizeof(double)), 0) << lp << " vs " << lq;
  for (size_t u = 0; u < p.size(); ++u) EXPECT_EQ(gp[u], gq[u]) << "unit " << u;
  for (int64_t i = 11 * 16; i < 128 * 16; ++i) {
    EXPECT_EQ(gq[0][static_cast<size_t>(wte.offset + i)], 0.0f) << "padded wte element " << i;
  }
  EXPECT_EQ(gpt_padded_vocab(1), 128);
  EXPECT_EQ(gpt_padded_vocab(128), 128);
  EXPECT_EQ(gpt_padded_vocab(129), 256);
  EXPECT_EQ(gpt_padded_vocab(50257), 50304);  // GPT-2's vocabulary, as llm.c pads it
}

TEST(Gpt, SpecNamesShapesAndInit) {
  const GptConfig c = gpt_config(100, 16, 32, 4, 3, 2);
  const ModelSpec spec = Gpt::spec_for(c);
  ASSERT_EQ(spec.units.size(), size_t{5});
  EXPECT_EQ(spec.units[0].name, "embed");
  EXPECT_EQ(spec.units[1].name, "h0");
  EXPECT_EQ(spec.units[3].name, "h2");
  EXPECT_EQ(spec.units[4].name, "head");
  const FlatLayout layout(spec, 1);
  auto expect_param = [&](const std::string& name, const Shape& shape, ParamInit::Kind kind, double scale) {
    const ParamPlacement& p = layout.param(name);
    EXPECT_EQ(p.shape, shape) << name;
    EXPECT_EQ(p.init.kind, kind) << name;
    if (kind == ParamInit::Kind::kNormal) {
      EXPECT_DOUBLE_EQ(p.init.scale, scale) << name;
    }
  };
  using K = ParamInit::Kind;
  const double residual = 0.02 / std::sqrt(6.0);
  expect_param("wte", {128, 32}, K::kNormal, 0.02);
  expect_param("wpe", {16, 32}, K::kNormal, 0.02);
  expect_param("h1.ln_1.weight", {32}, K::kOnes, 0);
  expect_param("h1.ln_1.bias", {32}, K::kZeros, 0);
  expect_param("h1.attn.c_attn.weight", {32, 96}, K::kNormal, 0.02);
  expect_param("h1.attn.c_attn.bias", {96}, K::kZeros, 0);
  expect_param("h1.attn.c_proj.weight", {32, 32}, K::kNormal, residual);
  expect_param("h1.attn.c_proj.bias", {32}, K::kZeros, 0);
  expect_param("h1.ln_2.weight", {32}, K::kOnes, 0);
  expect_param("h1.ln_2.bias", {32}, K::kZeros, 0);
  expect_param("h1.mlp.c_fc.weight", {32, 128}, K::kNormal, 0.02);
  expect_param("h1.mlp.c_fc.bias", {128}, K::kZeros, 0);
  expect_param("h1.mlp.c_proj.weight", {128, 32}, K::kNormal, residual);
  expect_param("h1.mlp.c_proj.bias", {32}, K::kZeros, 0);
  expect_param("ln_f.weight", {32}, K::kOnes, 0);
  expect_param("ln_f.bias", {32}, K::kZeros, 0);
  EXPECT_EQ(layout.param("h2.mlp.c_proj.bias").unit, 3);
  EXPECT_EQ(layout.param("ln_f.bias").unit, 4);
  const int64_t block = 2 * 32 + 32 * 96 + 96 + 32 * 32 + 32 + 2 * 32 + 32 * 128 + 128 + 128 * 32 + 32;
  EXPECT_EQ(spec.numel(), 128 * 32 + 16 * 32 + 3 * block + 2 * 32);
}

TEST(Gpt, ConfigErrorsNameTheField) {
  expect_config_error<Gpt>(gpt_config(0, 16, 32, 4, 2, 2), "gpt.vocab = 0: must be positive");
  expect_config_error<Gpt>(gpt_config(64, -1, 32, 4, 2, 2), "gpt.context = -1: must be positive");
  expect_config_error<Gpt>(gpt_config(64, 16, 0, 4, 2, 2), "gpt.channels = 0: must be positive");
  expect_config_error<Gpt>(gpt_config(64, 16, 32, 0, 2, 2), "gpt.heads = 0: must be positive");
  expect_config_error<Gpt>(gpt_config(64, 16, 32, 4, 0, 2), "gpt.layers = 0: must be positive");
  expect_config_error<Gpt>(gpt_config(64, 16, 32, 4, 2, 0), "gpt.micro_batch_size = 0: must be positive");
  expect_config_error<Gpt>(gpt_config(64, 16, 32, 5, 2, 2), "gpt.heads = 5 does not divide gpt.channels = 32");
  expect_config_error<Gpt>(gpt_config(64, 16, 32, 4, 2, 2, -1), "gpt.threads = -1: must be 0 (default) or positive");
  expect_config_error<Gpt>(gpt_config(int64_t{1} << 31, 16, 32, 4, 2, 2), "gpt.vocab = 2147483648: must be at most");
  GptConfig fp16 = gpt_config(64, 16, 32, 4, 2, 2);
  fp16.matmul_dtype = DType::kF16;
  expect_config_error<Gpt>(fp16, "compute.matmul_dtype = fp16: must be fp32 or bf16");
  GptConfig bad_regex = gpt_config(64, 16, 32, 4, 2, 2);
  bad_regex.fp32_ops = {"head", "h(0"};
  expect_config_error<Gpt>(bad_regex, "compute.fp32_ops[1] = 'h(0': not a valid regular expression");
  EXPECT_THROW(Gpt::spec_for(gpt_config(64, 16, 32, 3, 2, 2)), ConfigError);
  EXPECT_THROW(GptData(gpt_config(64, 0, 32, 4, 2, 2)), ConfigError);
}

TEST(Gpt, SizesAndCostsCountTheLayout) {
  // gpt_parameter_count is the layout's numel without wte's padding rows.
  for (const GptConfig& c : {gpt_config(64, 16, 32, 4, 2, 2), gpt_config(300, 8, 48, 6, 3, 1)}) {
    const double padding = static_cast<double>((gpt_padded_vocab(c.vocab) - c.vocab) * c.channels);
    EXPECT_EQ(gpt_parameter_count(c) + padding, static_cast<double>(Gpt::spec_for(c).numel()));
  }
  // GPT-2 124M at T = 1024: nanoGPT's 6 N + 12 L C T with N = 123,653,376
  // (wpe excluded, vocab 50257 unpadded).
  GptConfig gpt2 = gpt_config(50257, 1024, 768, 12, 12, 1);
  EXPECT_EQ(gpt_parameter_count(gpt2), 123653376.0 + 1024 * 768);
  EXPECT_EQ(gpt_train_flops_per_token(gpt2), 6 * 123653376.0 + 12.0 * 12 * 768 * 1024);
  EXPECT_EQ(gpt_matmul_dtype(std::nullopt, DType::kBF16), DType::kBF16);
  EXPECT_EQ(gpt_matmul_dtype(std::nullopt, DType::kF16), DType::kF32);
  EXPECT_EQ(gpt_matmul_dtype(DType::kF32, DType::kBF16), DType::kF32);
  EXPECT_THROW(gpt_matmul_dtype(DType::kF16, DType::kF32), ConfigError);
  const std::string d = gpt_describe(gpt_config(64, 16, 32, 4, 2, 2));
  EXPECT_EQ(d.rfind("GPT-2 of ", 0), 0u) << d;
  EXPECT_NE(d.find("(layers 2, channels 32, heads 4, context 16, vocab 64); GEMMs on fp32 inputs"), std::string::npos)
      << d;
}

TEST(Gpt, SampledTokensPrintAsBytesOrIds) {
  EXPECT_EQ(gpt_tokens_text({10, 65, 32, 0, 255}, 256), "\\nA \\x00\\xff");
  EXPECT_EQ(gpt_tokens_text({10, 65, 300}, 301), "10 65 300");
}

TEST(Gpt, SizeRulesNameTheFieldUnderThePrefix) {
  GptConfig c = gpt_config(64, 16, 32, 4, 2, 2);
  c.layers = int64_t{1} << 17;
  try {
    check_gpt_sizes(c, "model.gpt");
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.message(), "model.gpt.layers = 131072: must be at most 65536");
  }
  expect_config_error<Gpt>(c, "gpt.layers = 131072: must be at most 65536");
  c = gpt_config(1 << 20, 4096, 1 << 19, 4, 1, 2);  // 12 C^2 alone is 3.3e12 parameters
  expect_config_error<Gpt>(c, "gpt: 3.85045e+12 parameters; at most 2^40 (1.09951e+12) are supported");
}

TEST(Gpt, ModelEnforcesTheCallOrder) {
  const GptConfig c = gpt_config(20, 4, 8, 2, 1, 1);
  const FlatLayout layout(Gpt::spec_for(c), 1);
  Units32 p = init_params(layout, 1, 1.0f, 0.0f);
  Units32 g = p;
  const std::vector<Tensor> pt = wrap_units(p), gt = wrap_units(g);
  Gpt model(c);
  EXPECT_THROW(model.forward(0, pt[0]), EnforceError);  // no micro-batch yet
  model.begin_micro_batch(0);
  EXPECT_THROW(model.forward(1, pt[1]), EnforceError);  // out of order
  EXPECT_THROW(model.forward(0, pt[1]), EnforceError);  // too small for unit 0
  model.forward(0, pt[0]);
  EXPECT_THROW(model.loss(), EnforceError);
  EXPECT_THROW(model.backward(0, pt[0], gt[0]), EnforceError);
  model.forward(1, pt[1]);
  model.forward(2, pt[2]);
  EXPECT_THROW(model.forward(3, pt[2]), EnforceError);  // no unit 3
  EXPECT_THROW(model.backward(1, pt[1], gt[1]), EnforceError);  // must start at the head
  Allocator alloc;
  const Tensor bf16_grads = Tensor::zeros(alloc, DType::kBF16, {gt[2].numel()}, MemCategory::kOther);
  EXPECT_THROW(model.backward(2, pt[2], bf16_grads), EnforceError);
  EXPECT_NO_THROW(run_model(model, 1, pt, gt));
}

TEST(Gpt, DataIsAPureFunctionOfTheIndexAndLearnable) {
  const GptConfig c = gpt_config(64, 16, 32, 4, 2, 2);
  const GptData a(c), b(c);
  const Batch x = load(c, 17), y = load(c, 17), z = load(c, 18);
  EXPECT_EQ(x.inputs, y.inputs);
  EXPECT_EQ(x.targets, y.targets);
  EXPECT_NE(x.inputs, z.inputs);
  // Row b of micro-batch g is sequence g B + b, shifted by one for the targets.
  std::vector<int32_t> seq(17);
  for (int64_t r = 0; r < 2; ++r) {
    a.sequence(17 * 2 + r, seq.data());
    for (int64_t t = 0; t < 16; ++t) {
      EXPECT_EQ(x.inputs[static_cast<size_t>(r * 16 + t)], seq[static_cast<size_t>(t)]) << r << " " << t;
      EXPECT_EQ(x.targets[static_cast<size_t>(r * 16 + t)], seq[static_cast<size_t>(t + 1)]) << r << " " << t;
    }
  }
  // Two micro-batches of 2 sequences hold one micro-batch of 4.
  GptConfig c4 = c;
  c4.micro_batch_size = 4;
  const Batch w = load(c4, 3), lo = load(c, 6), hi = load(c, 7);
  std::vector<int32_t> joined = lo.inputs;
  joined.insert(joined.end(), hi.inputs.begin(), hi.inputs.end());
  EXPECT_EQ(w.inputs, joined);
  EXPECT_THROW(a.micro_batch(-1, seq.data(), seq.data()), EnforceError);
  // The empirical conditional entropy H(next | token) over many sequences
  // is far below ln(vocab): the chain is learnable.
  std::vector<int64_t> counts(64 * 64, 0);
  std::set<int32_t> seen;
  for (int64_t s = 0; s < 4000; ++s) {
    b.sequence(s, seq.data());
    for (int64_t t = 0; t < 16; ++t) {
      const int32_t cur = seq[static_cast<size_t>(t)], nxt = seq[static_cast<size_t>(t + 1)];
      ASSERT_TRUE(cur >= 0 && cur < 64 && nxt >= 0 && nxt < 64) << cur << " -> " << nxt;
      ++counts[static_cast<size_t>(cur * 64 + nxt)];
      seen.insert(cur);
    }
  }
  double h = 0.0, total = 0.0;
  for (int64_t v = 0; v < 64; ++v) {
    double row = 0.0;
    for (int64_t w2 = 0; w2 < 64; ++w2) row += static_cast<double>(counts[static_cast<size_t>(v * 64 + w2)]);
    for (int64_t w2 = 0; w2 < 64; ++w2) {
      const auto n = static_cast<double>(counts[static_cast<size_t>(v * 64 + w2)]);
      if (n > 0) h -= n * std::log(n / row);
    }
    total += row;
  }
  h /= total;
  RecordProperty("conditional_entropy", std::to_string(h));
  EXPECT_EQ(seen.size(), size_t{64});
  EXPECT_LT(h, 0.6 * std::log(64.0));
  EXPECT_GT(h, 0.3 * std::log(64.0));  // not deterministic either
}

// ---- Note [GPT autocast] -----------------------------------------------------

// Loss and gradients of `c` on micro-batch g through the Model interface.
double loss_and_grads(const GptConfig& c, const Units32& p, int64_t g, Units32& grads) {
  Units32 params = p;
  grads = p;
  const std::vector<Tensor> pt = wrap_units(params), gt = wrap_units(grads);
  Gpt model(c);
  return run_model(model, g, pt, gt);
}

TEST(Gpt, Bf16MatmulsMatchTheDoublePathWithinBf16Rounding) {
  GptConfig c = gpt_config(64, 16, 32, 4, 2, 2, 2);
  c.matmul_dtype = DType::kBF16;
  const FlatLayout layout(Gpt::spec_for(c), 1);
  const Units32 p32 = init_params(layout, 5, 1.0f, 0.1f);
  const Units64 p64 = to_double(p32);
  GptConfig c32 = c;
  c32.matmul_dtype = DType::kF32;
  double max_loss_rel = 0.0, max_grad_rel = 0.0;
  for (int64_t g : {0, 3, 1000}) {
    Units32 g16, g32;
    const double loss16 = loss_and_grads(c, p32, g, g16);
    const double loss32 = loss_and_grads(c32, p32, g, g32);
    const Batch data = load(c, g);
    Units64 g64;
    const double loss64 = gpt_loss_and_grads<double>(c, data.inputs.data(), data.targets.data(), p64, g64);
    // The bf16 path is taken: the result differs from the fp32 GEMMs'.
    EXPECT_NE(loss16, loss32) << "micro-batch " << g;
    // Activations between bf16 ops stored in bf16 (Note [GPT activations]:
    // 8 significant bits, relative error <= 2^-8 each): measured 1.5e-5
    // relative on the loss, 8.3e-3 of a parameter's largest gradient on its
    // elements; the bounds leave about 2x.
    max_loss_rel = std::max(max_loss_rel, std::abs(loss16 - loss64) / loss64);
    EXPECT_NEAR(loss16, loss64, 3e-5 * loss64) << "micro-batch " << g;
    for (size_t u = 0; u < p32.size(); ++u) {
      for (const ParamPlacement& pp : layout.unit(static_cast<int>(u)).params) {
        const double scale = max_abs(g64[u], pp);
        for (int64_t i = pp.offset; i < pp.offset + pp.numel; ++i) {
          const auto k = static_cast<size_t>(i);
          max_grad_rel = std::max(max_grad_rel, std::abs(g16[u][k] - g64[u][k]) / scale);
          EXPECT_NEAR(g16[u][k], g64[u][k], 2e-2 * scale) << pp.name << "[" << i - pp.offset << "] micro-batch " << g;
        }
      }
    }
  }
  RecordProperty("max_loss_rel_err", sci(max_loss_rel));
  RecordProperty("max_grad_rel_err", sci(max_grad_rel));
}

TEST(Gpt, Fp32OpsKeepTheirOpsExactlyFp32) {
  GptConfig c = gpt_config(64, 16, 32, 4, 3, 2, 2);
  c.matmul_dtype = DType::kBF16;
  const FlatLayout layout(Gpt::spec_for(c), 1);
  const Units32 p = init_params(layout, 11, 1.0f, 0.1f);
  GptConfig fp32 = c;
  fp32.matmul_dtype = DType::kF32;
  Units32 g_fp32, g_all, g_bf16, g_head, g_head_blocks;
  const double loss_fp32 = loss_and_grads(fp32, p, 2, g_fp32);
  const double loss_bf16 = loss_and_grads(c, p, 2, g_bf16);
  // ".*" matches every op: bit for bit the fp32 model.
  GptConfig all = c;
  all.fp32_ops = {".*"};
  const double loss_all = loss_and_grads(all, p, 2, g_all);
  EXPECT_EQ(std::memcmp(&loss_all, &loss_fp32, sizeof(double)), 0);
  EXPECT_EQ(g_all, g_fp32);
  // "head" alone: the blocks stay bf16, so neither result.
  GptConfig head = c;
  head.fp32_ops = {"head"};
  const double loss_head = loss_and_grads(head, p, 2, g_head);
  EXPECT_NE(loss_head, loss_fp32);
  EXPECT_NE(loss_head, loss_bf16);
  // The blocks by name plus the head: every op, the fp32 model again.
  GptConfig named = c;
  named.fp32_ops = {"head", "h[0-9]+\\.attn\\..*", "h[0-9]+\\.mlp\\.c_(fc|proj)"};
  const double loss_named = loss_and_grads(named, p, 2, g_head_blocks);
  EXPECT_EQ(std::memcmp(&loss_named, &loss_fp32, sizeof(double)), 0);
  EXPECT_EQ(g_head_blocks, g_fp32);
}

TEST(Gpt, OpNamesAndTheirDtypes) {
  const std::vector<std::string> names = gpt_matmul_op_names(2);
  EXPECT_EQ(names, (std::vector<std::string>{"h0.attn.c_attn", "h0.attn.c_proj", "h0.mlp.c_fc", "h0.mlp.c_proj",
                                             "h1.attn.c_attn", "h1.attn.c_proj", "h1.mlp.c_fc", "h1.mlp.c_proj",
                                             "head"}));
  GptConfig c = gpt_config(64, 16, 32, 4, 12, 2);
  const auto F = DType::kF32, B = DType::kBF16;
  EXPECT_EQ(gpt_matmul_op_dtypes(c), std::vector<DType>(49, F));  // fp32: fp32_ops do not matter
  c.fp32_ops = {"head"};
  EXPECT_EQ(gpt_matmul_op_dtypes(c), std::vector<DType>(49, F));
  c.matmul_dtype = B;
  std::vector<DType> expected(49, B);
  expected[48] = F;
  EXPECT_EQ(gpt_matmul_op_dtypes(c), expected);
  // The whole name must match: "h1" matches nothing, "h1\..*" only block 1
  // (not h10, h11), "h1.*" blocks 1, 10 and 11.
  c.fp32_ops = {"h1"};
  EXPECT_EQ(gpt_matmul_op_dtypes(c), std::vector<DType>(49, B));
  c.fp32_ops = {"h1\\..*"};
  expected.assign(49, B);
  for (int k = 4; k < 8; ++k) expected[static_cast<size_t>(k)] = F;
  EXPECT_EQ(gpt_matmul_op_dtypes(c), expected);
  c.fp32_ops = {"h1.*"};
  for (int k = 40; k < 48; ++k) expected[static_cast<size_t>(k)] = F;
  EXPECT_EQ(gpt_matmul_op_dtypes(c), expected);
  c.fp32_ops = {".*\\.mlp\\..*", "head"};
  expected.assign(49, B);
  for (int l = 0; l < 12; ++l) {
    expected[static_cast<size_t>(4 * l + 2)] = F;
    expected[static_cast<size_t>(4 * l + 3)] = F;
  }
  expected[48] = F;
  EXPECT_EQ(gpt_matmul_op_dtypes(c), expected);
}

TEST(Gpt, AdamOnMarkovDataLowersTheLoss) {
  const GptConfig c = gpt_config(64, 16, 32, 4, 2, 4, 1);
  const FlatLayout layout(Gpt::spec_for(c), 1);
  Units32 p = init_params(layout, 3, 1.0f, 0.0f);
  Units32 g = p, m = p, v = p;
  for (size_t u = 0; u < p.size(); ++u) {
    std::fill(m[u].begin(), m[u].end(), 0.0f);
    std::fill(v[u].begin(), v[u].end(), 0.0f);
  }
  const std::vector<Tensor> pt = wrap_units(p), gt = wrap_units(g);
  Gpt model(c);
  // Held-out micro-batches, never trained on.
  auto eval = [&] {
    double sum = 0.0;
    for (int64_t k = 0; k < 8; ++k) sum += run_model(model, 1'000'000 + k, pt, gt);
    return sum / 8;
  };
  const auto start = std::chrono::steady_clock::now();
  const double initial = eval();
  const float lr = 5e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  const int steps = 300;
  for (int s = 1; s <= steps; ++s) {
    run_model(model, s, pt, gt);
    const float c1 = 1.0f - std::pow(beta1, static_cast<float>(s));
    const float c2 = 1.0f - std::pow(beta2, static_cast<float>(s));
    for (size_t u = 0; u < p.size(); ++u) {
      for (size_t i = 0; i < p[u].size(); ++i) {
        m[u][i] = beta1 * m[u][i] + (1 - beta1) * g[u][i];
        v[u][i] = beta2 * v[u][i] + (1 - beta2) * g[u][i] * g[u][i];
        p[u][i] -= lr * (m[u][i] / c1) / (std::sqrt(v[u][i] / c2) + eps);
      }
    }
  }
  const double trained = eval();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RecordProperty("initial_loss", std::to_string(initial));
  RecordProperty("trained_loss", std::to_string(trained));
  RecordProperty("seconds", std::to_string(seconds));
  EXPECT_NEAR(initial, std::log(64.0), 0.1);
  EXPECT_LT(trained, 0.7 * std::log(64.0)) << "initial " << initial << ", after " << steps << " steps " << trained;
}

}  // namespace
}  // namespace mp

namespace mp::testing {
namespace {

// The memory plan's activations row is what the constructor allocates,
// also where blocks are recomputed (Note [GPT recomputation]), which keeps
// less: with every block recomputed, their activations shrink to one
// block's plus each block's input.
TEST(Gpt, ActivationBytesAreWhatTheModelAllocates) {
  GptConfig bf16 = gpt_config(300, 24, 32, 4, 3, 3);
  bf16.matmul_dtype = DType::kBF16;
  bf16.fp32_ops = {"h1.attn.c_proj"};
  for (const GptConfig& c : {small_gpt(), gpt_config(300, 24, 32, 4, 3, 3), bf16}) {
    int64_t bytes[3] = {0, 0, 0};
    for (int every : {0, 1, 2}) {
      GptOptions o;
      o.recompute_every = every;
      Allocator alloc;
      const Gpt gpt(c, alloc, nullptr, o);
      bytes[every] = Gpt::activation_bytes(c, Device::cpu(), o);
      EXPECT_EQ(static_cast<int64_t>(alloc.stats().current_bytes[static_cast<size_t>(MemCategory::kActivations)]),
                bytes[every]);
      for (int u = 0; u < static_cast<int>(gpt.spec().units.size()); ++u) {
        const bool block = u >= 1 && u <= c.layers;
        EXPECT_EQ(gpt.recomputes(u), block && (every == 1 || (every == 2 && (u - 1) % 2 == 0))) << u;
      }
    }
    EXPECT_LT(bytes[1], bytes[2]);
    if (c.layers >= 3) {
      EXPECT_LT(bytes[2], bytes[0]);
    } else {  // one of two blocks recomputed: its scratch is the Layer it does not keep
      EXPECT_EQ(bytes[2], bytes[0]);
    }
  }
}

// A recomputed block's backward needs recompute just before it; recompute
// of a block that keeps its activations, or out of order, is refused.
TEST(Gpt, RecomputeComesJustBeforeTheBackwardOfARecomputedBlock) {
  const GptConfig c = gpt_config(50, 8, 16, 2, 2, 2);
  GptOptions o;
  o.recompute_every = 2;  // block 0 (unit 1) only
  Gpt gpt(c, Allocator(), nullptr, o);
  const FlatLayout layout(gpt.spec(), 1);
  Units32 params = init_params(layout, 3, 1.0f, 0.1f);
  std::vector<float> grads(static_cast<size_t>(layout.max_padded_numel()));
  auto t = [](std::vector<float>& v) { return Tensor::wrap(v.data(), Device::cpu(), DType::kF32, {static_cast<int64_t>(v.size())}); };
  gpt.begin_micro_batch(0);
  for (int u = 0; u < 4; ++u) gpt.forward(u, t(params[static_cast<size_t>(u)]));
  gpt.backward(3, t(params[3]), t(grads));
  EXPECT_PRED2(contains, error_of<EnforceError>([&] { gpt.recompute(2, t(params[2])); }),
               "Gpt::recompute of unit h1, which keeps its activations");
  gpt.backward(2, t(params[2]), t(grads));
  EXPECT_PRED2(contains, error_of<EnforceError>([&] { gpt.backward(1, t(params[1]), t(grads)); }),
               "Gpt::backward of unit 1, whose activations are recomputed, without recompute just before it");
  gpt.recompute(1, t(params[1]));
  gpt.backward(1, t(params[1]), t(grads));
}

}  // namespace
}  // namespace mp::testing

namespace mp::testing {
namespace {

// Note [GPT loss]: the loss in chunks of rows (as on a GPU, with d logits
// in place) gives the same loss bit for bit (the same rows' losses, summed
// in the same order) and the same gradients up to the order d wte's chunks
// are summed in.
TEST(Gpt, LossInChunksEqualsTheWholeBatchLoss) {
  for (DType matmul : {DType::kF32, DType::kBF16}) {
    GptConfig c = gpt_config(50, 8, 16, 2, 2, 2);  // 16 rows: chunks of 7, 7 and 2
    c.matmul_dtype = matmul;
    const FlatLayout layout(Gpt::spec_for(c), 1);
    Units32 p = init_params(layout, 17, 1.0f, 0.1f);
    Units32 g_whole = p, g_chunks = p;
    const std::vector<Tensor> pt = wrap_units(p), gw = wrap_units(g_whole), gc = wrap_units(g_chunks);
    Gpt whole(c);
    GptOptions o;
    o.loss_chunk_rows = 7;
    Gpt chunks(c, Allocator(), nullptr, o);
    ASSERT_EQ(Gpt::loss_chunk_rows(c, Device::cpu(), o), 7);
    const double lw = run_model(whole, 3, pt, gw), lc = run_model(chunks, 3, pt, gc);
    EXPECT_EQ(std::memcmp(&lw, &lc, sizeof(double)), 0) << lw << " vs " << lc << ", " << dtype_name(matmul);
    for (size_t u = 0; u < p.size(); ++u) {
      const double scale = *std::max_element(g_whole[u].begin(), g_whole[u].end(),
                                              [](float a, float b) { return std::abs(a) < std::abs(b); });
      for (size_t i = 0; i < p[u].size(); ++i) {
        ASSERT_NEAR(g_chunks[u][i], g_whole[u][i], 1e-5 * std::abs(scale) + 1e-12)
            << "unit " << u << " element " << i << ", " << dtype_name(matmul);
      }
    }
    EXPECT_THROW(chunks.logits(), EnforceError);  // overwritten by d logits: kept only when asked
  }
}

// GptOptions::keep_logits keeps every forward's logits (widened): the same
// whether the loss runs in chunks or not, each row the kept row.
TEST(Gpt, KeptLogitsAreTheLogitsOfEveryChunk) {
  for (DType matmul : {DType::kF32, DType::kBF16}) {
    GptConfig c = gpt_config(50, 8, 16, 2, 2, 2);
    c.matmul_dtype = matmul;
    const FlatLayout layout(Gpt::spec_for(c), 1);
    Units32 p = init_params(layout, 17, 1.0f, 0.1f), g = p;
    const std::vector<Tensor> pt = wrap_units(p), gt = wrap_units(g);
    GptOptions whole_o, chunks_o;
    whole_o.keep_logits = chunks_o.keep_logits = true;
    chunks_o.loss_chunk_rows = 7;
    Gpt whole(c, Allocator(), nullptr, whole_o), chunks(c, Allocator(), nullptr, chunks_o);
    whole.keep_logits_row(9);
    run_model(whole, 3, pt, gt);
    run_model(chunks, 3, pt, gt);
    const int64_t vp = gpt_padded_vocab(c.vocab);
    const std::vector<float> a(whole.logits(), whole.logits() + 16 * vp), b(chunks.logits(), chunks.logits() + 16 * vp);
    EXPECT_EQ(a, b) << dtype_name(matmul);
    EXPECT_EQ(whole.kept_logits(), std::vector<float>(a.begin() + 9 * vp, a.begin() + 10 * vp)) << dtype_name(matmul);
    EXPECT_NE(a[0], 0.0f);
  }
}

}  // namespace
}  // namespace mp::testing

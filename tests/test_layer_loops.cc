// The GPT layer loops' ISA variants (kernels/cpu/layer_loops.h): every variant
// this CPU runs gives the baseline's bits, on inputs with exp's clamps,
// NaN, Inf, denormals and bf16 ties, and on lengths that leave vector tails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/convert_math.h"
#include "kernels/cpu/layer_loops.h"

namespace mp {
namespace {

std::vector<float> inputs(int64_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float& x = v[static_cast<size_t>(i)];
    switch (i % 61) {
      case 3: x = std::numeric_limits<float>::quiet_NaN(); break;
      case 5: x = -std::numeric_limits<float>::infinity(); break;
      case 7: x = 1e-40f; break;
      case 11: x = -200.0f; break;  // below exp's clamp
      case 13: x = math::f32_from_bits(0x3f808000u); break;  // a bf16 tie
      case 17: x = 95.0f; break;    // above exp's clamp
      case 19: x = -43.7f; break;   // 2u reaches the clamp in gelu
      default: x = normal(rng);
    }
  }
  return v;
}

template <class V>
void expect_same_bits(const std::vector<V>& want, const std::vector<V>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(V)), 0) << what;
}

std::vector<CpuIsa> wider_isas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (cpu_isa_available(isa)) isas.push_back(isa);
  }
  return isas;
}

TEST(LayerLoops, ElementwiseVariantsMatchBaseline) {
  const int64_t n = 1000 + 13;  // vector tails
  const auto x = inputs(n, 1, 3.0f), d = inputs(n, 2, 1.0f);
  const LayerLoops& base = layer_loops(CpuIsa::kBaseline);
  auto run = [&](const LayerLoops& l) {
    std::vector<float> gelu(n), dgelu(n), sum(n), through(n);
    std::vector<bf16> rounded(n);
    l.gelu_forward(x.data(), gelu.data(), 1, n);  // a part not starting at 0
    l.gelu_backward(x.data(), d.data(), dgelu.data(), 0, n);
    l.add(x.data(), d.data(), sum.data(), 0, n);
    l.round_to_bf16(x.data(), rounded.data(), 0, n);
    l.round_through_bf16(x.data(), through.data(), 0, n);
    return std::make_tuple(gelu, dgelu, sum, through, rounded);
  };
  const auto want = run(base);
  for (CpuIsa isa : wider_isas()) {
    const auto got = run(layer_loops(isa));
    const std::string name(cpu_isa_name(isa));
    expect_same_bits(std::get<0>(want), std::get<0>(got), name + " gelu");
    expect_same_bits(std::get<1>(want), std::get<1>(got), name + " gelu backward");
    expect_same_bits(std::get<2>(want), std::get<2>(got), name + " add");
    expect_same_bits(std::get<3>(want), std::get<3>(got), name + " round through bf16");
    expect_same_bits(std::get<4>(want), std::get<4>(got), name + " round to bf16");
  }
  if (wider_isas().empty()) GTEST_SKIP() << "this CPU has only the baseline variant";
}

TEST(LayerLoops, RowVariantsMatchBaseline) {
  const int64_t rows = 6, channels = 72, heads = 3, seq = 3, vocab = 50, padded = 64;
  const auto x = inputs(rows * channels, 3, 2.0f), g = inputs(rows * channels, 4, 1.0f);
  const auto w = inputs(channels, 5, 1.0f), b = inputs(channels, 6, 1.0f);
  // Finite inputs for the row reductions (one NaN would make every output NaN).
  auto finite = [](std::vector<float> v) {
    for (float& e : v) e = std::isfinite(e) ? std::fmod(e, 8.0f) : 0.5f;
    return v;
  };
  const auto xf = finite(x), gf = finite(g), wf = finite(w), bf = finite(b);
  const auto qkv = finite(inputs(rows * 3 * channels, 7, 1.0f));
  const auto logits = finite(inputs(rows * padded, 8, 4.0f));
  const std::vector<int32_t> targets = {0, 49, 7, 13, 21, 34};
  auto run = [&](const LayerLoops& l) {
    std::vector<float> out(rows * channels), mean(rows), rstd(rows), dx(rows * channels, 0.25f), dw(channels),
        db(channels), bias(channels), att(2 * heads * seq * seq), atty(rows * channels), scratch(2 * heads * seq),
        dqkv(rows * 3 * channels), loss(rows), dlogits(rows * padded);
    l.layernorm_forward({xf.data(), wf.data(), bf.data(), channels, out.data(), mean.data(), rstd.data()}, 0, rows);
    const LayerNormGradLoopArgs<float> ln{gf.data(), xf.data(), wf.data(), mean.data(), rstd.data(), rows, channels,
                                          dx.data(), dw.data(), db.data()};
    l.layernorm_grad_input(ln, 0, rows);
    l.layernorm_grad_params(ln, 0, channels);
    l.bias_grad(gf.data(), rows, channels, bias.data(), 0, channels);
    l.attention_forward({qkv.data(), nullptr, nullptr, seq, channels, heads, att.data(), atty.data(), nullptr, nullptr},
                        0, 2 * heads);
    l.attention_backward({qkv.data(), att.data(), gf.data(), seq, channels, heads, nullptr, nullptr, scratch.data(),
                          dqkv.data()},
                         0, 2 * heads);
    l.softmax_xent({logits.data(), targets.data(), vocab, padded, 1.0f / rows, loss.data(), dlogits.data()}, 0, rows);
    return std::vector<std::vector<float>>{out, mean, rstd, dx, dw, db, bias, att, atty, dqkv, loss, dlogits};
  };
  const auto want = run(layer_loops(CpuIsa::kBaseline));
  const char* names[] = {"ln out", "ln mean", "ln rstd", "ln dx", "ln dw",   "ln db",
                         "bias grad", "att", "att out", "dqkv", "row loss", "dlogits"};
  for (CpuIsa isa : wider_isas()) {
    const auto got = run(layer_loops(isa));
    for (size_t i = 0; i < want.size(); ++i) {
      expect_same_bits(want[i], got[i], std::string(cpu_isa_name(isa)) + " " + names[i]);
    }
  }
  if (wider_isas().empty()) GTEST_SKIP() << "this CPU has only the baseline variant";
}

// The bf16 activations' paths (loads widened, outputs rounded in the same
// pass, kernels/cpu/layer_loops.h) give the baseline's bits on every variant.
TEST(LayerLoops, Bf16ActivationVariantsMatchBaseline) {
  const int64_t rows = 6, channels = 72, heads = 3, seq = 3;
  auto finite = [](std::vector<float> v) {
    for (float& e : v) e = std::isfinite(e) ? std::fmod(e, 8.0f) : 0.5f;
    return v;
  };
  const auto x = finite(inputs(rows * channels, 3, 2.0f)), w = finite(inputs(channels, 5, 1.0f)),
             b = finite(inputs(channels, 6, 1.0f));
  auto bf16s = [](const std::vector<float>& v) {
    std::vector<bf16> out;
    for (float e : v) out.push_back(math::from_f32<bf16>(e));
    return out;
  };
  const auto g16 = bf16s(finite(inputs(rows * channels, 4, 1.0f)));
  const auto qkv16 = bf16s(finite(inputs(rows * 3 * channels, 7, 1.0f)));
  auto widened = [](const std::vector<bf16>& v) {
    std::vector<float> out;
    for (bf16 e : v) out.push_back(math::to_f32(e));
    return out;
  };
  auto run = [&](const LayerLoops& l) {
    std::vector<bf16> out16(rows * channels), copy16(rows * channels), atty16(rows * channels),
        dqkv16(rows * 3 * channels);
    std::vector<float> mean(rows), rstd(rows), dx(rows * channels, 0.25f), dw(channels), db(channels),
        att(2 * heads * seq * seq), scratch(2 * heads * seq);
    LayerNormLoopArgs<float> fwd{x.data(), w.data(), b.data(), channels, nullptr, mean.data(), rstd.data()};
    fwd.out16 = out16.data();
    l.layernorm_forward(fwd, 0, rows);
    LayerNormGradLoopArgs<float> ln{nullptr, x.data(), w.data(), mean.data(), rstd.data(), rows, channels,
                                    dx.data(),  dw.data(), db.data()};
    ln.dout16 = g16.data();
    ln.dx_copy16 = copy16.data();
    l.layernorm_grad_input(ln, 0, rows);
    l.layernorm_grad_params(ln, 0, channels);
    AttentionLoopArgs<float> af{nullptr, nullptr, nullptr, seq, channels, heads, att.data(), nullptr, nullptr, nullptr};
    af.qkv16 = qkv16.data();
    af.out16 = atty16.data();
    l.attention_forward(af, 0, 2 * heads);
    AttentionLoopArgs<float> ab{nullptr, att.data(), nullptr, seq, channels, heads, nullptr, nullptr, scratch.data(),
                                nullptr};
    ab.qkv16 = qkv16.data();
    ab.dout16 = g16.data();
    ab.dqkv16 = dqkv16.data();
    l.attention_backward(ab, 0, 2 * heads);
    return std::vector<std::vector<float>>{widened(out16), mean, dx, widened(copy16), dw, db, att, widened(atty16),
                                           widened(dqkv16)};
  };
  const auto want = run(layer_loops(CpuIsa::kBaseline));
  const char* names[] = {"ln out", "ln mean", "ln dx", "ln dx copy", "ln dw", "ln db", "att", "att out", "dqkv"};
  for (CpuIsa isa : wider_isas()) {
    const auto got = run(layer_loops(isa));
    for (size_t i = 0; i < want.size(); ++i) {
      expect_same_bits(want[i], got[i], std::string(cpu_isa_name(isa)) + " bf16 " + names[i]);
    }
  }
  if (wider_isas().empty()) GTEST_SKIP() << "this CPU has only the baseline variant";
}

TEST(LayerLoops, MissingVariantIsAnError) {
  EXPECT_THROW(layer_loops(CpuIsa::kScalar), std::exception);
}

}  // namespace
}  // namespace mp

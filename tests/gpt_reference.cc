// gpt_loss_and_grads (tests/model_reference.h): the GPT on flat buffers. float runs
// the model itself on the CPU; double is the tests' reference, the same
// math as plain calls of the double loops of the CPU layer ops on
// vectors, one activation per vector, nothing fused or chunked.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/loss.h"
#include "models/flat_layout.h"
#include "models/gpt.h"
#include "tests/gpt_test_ops.h"
#include "tests/model_reference.h"

namespace mp {
namespace {

using Vec = std::vector<double>;

// Parameter `name` in the flat buffers, and its gradient.
struct Params {
  const FlatLayout& layout;
  const std::vector<Vec>& values;
  std::vector<Vec>& grads;
  const double* operator()(const std::string& name) const { return at(values, name); }
  double* grad(const std::string& name) const { return const_cast<double*>(at(grads, name)); }
  const double* at(const std::vector<Vec>& v, const std::string& name) const {
    const ParamPlacement& p = layout.param(name);
    return v[static_cast<size_t>(p.unit)].data() + p.offset;
  }
};

double reference(const GptConfig& c, const int32_t* inputs, const int32_t* targets, const Params& P) {
  const int64_t B = c.micro_batch_size, T = c.context, C = c.channels, NH = c.heads, L = c.layers;
  const int64_t N = B * T, V = gpt_padded_vocab(c.vocab);
  auto zeros = [](int64_t n) { return Vec(static_cast<size_t>(n), 0.0); };
  // The forward, keeping what the backward reads.
  struct Block {
    Vec in, ln1, m1, r1, qkv, att, y, res2, ln2, m2, r2, fc, gelu;
  };
  std::vector<Block> blocks(static_cast<size_t>(L));
  Vec x = zeros(N * C);
  gpt_embedding_forward<double>(inputs, P("wte"), P("wpe"), B, T, C, c.vocab, x.data(), 1);
  for (int64_t l = 0; l < L; ++l) {
    Block& k = blocks[static_cast<size_t>(l)];
    const std::string h = "h" + std::to_string(l) + ".";
    k.in = x;
    k.ln1 = zeros(N * C), k.m1 = zeros(N), k.r1 = zeros(N), k.qkv = zeros(3 * N * C);
    k.att = zeros(B * NH * T * T), k.y = zeros(N * C), k.res2 = zeros(N * C);
    k.ln2 = zeros(N * C), k.m2 = zeros(N), k.r2 = zeros(N), k.fc = zeros(4 * N * C), k.gelu = zeros(4 * N * C);
    gpt_layernorm_forward<double>(x.data(), P(h + "ln_1.weight"), P(h + "ln_1.bias"), N, C, k.ln1.data(),
                                  k.m1.data(), k.r1.data(), 1);
    gpt_matmul_forward<double>(k.ln1.data(), P(h + "attn.c_attn.weight"), P(h + "attn.c_attn.bias"), N, C, 3 * C,
                               k.qkv.data(), 1);
    gpt_attention_forward<double>(k.qkv.data(), B, T, C, NH, k.att.data(), k.y.data(), 1);
    gpt_matmul_forward<double>(k.y.data(), P(h + "attn.c_proj.weight"), P(h + "attn.c_proj.bias"), N, C, C,
                               k.res2.data(), 1);
    gpt_add<double>(x.data(), k.res2.data(), N * C, k.res2.data(), 1);
    gpt_layernorm_forward<double>(k.res2.data(), P(h + "ln_2.weight"), P(h + "ln_2.bias"), N, C, k.ln2.data(),
                                  k.m2.data(), k.r2.data(), 1);
    gpt_matmul_forward<double>(k.ln2.data(), P(h + "mlp.c_fc.weight"), P(h + "mlp.c_fc.bias"), N, C, 4 * C,
                               k.fc.data(), 1);
    gpt_gelu_forward<double>(k.fc.data(), 4 * N * C, k.gelu.data(), 1);
    gpt_matmul_forward<double>(k.gelu.data(), P(h + "mlp.c_proj.weight"), P(h + "mlp.c_proj.bias"), N, 4 * C, C,
                               x.data(), 1);
    gpt_add<double>(k.res2.data(), x.data(), N * C, x.data(), 1);
  }
  Vec lnf = zeros(N * C), mf = zeros(N), rf = zeros(N);
  Vec logits = zeros(N * V), row_loss = zeros(N), dlogits = zeros(N * V);
  gpt_layernorm_forward<double>(x.data(), P("ln_f.weight"), P("ln_f.bias"), N, C, lnf.data(), mf.data(), rf.data(), 1);
  gpt_logits_forward<double>(lnf.data(), P("wte"), N, C, V, logits.data(), 1);
  const double loss =
      gpt_softmax_xent<double>(logits.data(), targets, N, c.vocab, V, row_loss.data(), dlogits.data(), 1);
  // The backward: dx is d loss / d (the residual stream).
  Vec dln = zeros(N * C), dx = zeros(N * C);
  gpt_logits_backward<double>(lnf.data(), P("wte"), dlogits.data(), N, C, V, dln.data(), P.grad("wte"), 1);
  gpt_layernorm_backward<double>(dln.data(), x.data(), P("ln_f.weight"), mf.data(), rf.data(), N, C, dx.data(),
                                 P.grad("ln_f.weight"), P.grad("ln_f.bias"), 1);
  for (int64_t l = L - 1; l >= 0; --l) {
    const Block& k = blocks[static_cast<size_t>(l)];
    const std::string h = "h" + std::to_string(l) + ".";
    Vec dgelu = zeros(4 * N * C), dln2 = zeros(N * C), dy = zeros(N * C), dqkv = zeros(3 * N * C);
    Vec scratch = zeros(B * NH * T);
    gpt_matmul_backward<double>(k.gelu.data(), P(h + "mlp.c_proj.weight"), dx.data(), N, 4 * C, C, dgelu.data(),
                                P.grad(h + "mlp.c_proj.weight"), P.grad(h + "mlp.c_proj.bias"), 1);
    gpt_gelu_backward<double>(k.fc.data(), dgelu.data(), 4 * N * C, dgelu.data(), 1);
    gpt_matmul_backward<double>(k.ln2.data(), P(h + "mlp.c_fc.weight"), dgelu.data(), N, C, 4 * C, dln2.data(),
                                P.grad(h + "mlp.c_fc.weight"), P.grad(h + "mlp.c_fc.bias"), 1);
    gpt_layernorm_backward<double>(dln2.data(), k.res2.data(), P(h + "ln_2.weight"), k.m2.data(), k.r2.data(), N, C,
                                   dx.data(), P.grad(h + "ln_2.weight"), P.grad(h + "ln_2.bias"), 1);
    gpt_matmul_backward<double>(k.y.data(), P(h + "attn.c_proj.weight"), dx.data(), N, C, C, dy.data(),
                                P.grad(h + "attn.c_proj.weight"), P.grad(h + "attn.c_proj.bias"), 1);
    gpt_attention_backward<double>(k.qkv.data(), k.att.data(), dy.data(), B, T, C, NH, scratch.data(), dqkv.data(), 1);
    Vec dln1 = zeros(N * C);
    gpt_matmul_backward<double>(k.ln1.data(), P(h + "attn.c_attn.weight"), dqkv.data(), N, C, 3 * C, dln1.data(),
                                P.grad(h + "attn.c_attn.weight"), P.grad(h + "attn.c_attn.bias"), 1);
    gpt_layernorm_backward<double>(dln1.data(), k.in.data(), P(h + "ln_1.weight"), k.m1.data(), k.r1.data(), N, C,
                                   dx.data(), P.grad(h + "ln_1.weight"), P.grad(h + "ln_1.bias"), 1);
  }
  double* dwpe = P.grad("wpe");
  std::fill(dwpe, dwpe + T * C, 0.0);
  gpt_embedding_backward<double>(inputs, dx.data(), B, T, C, P.grad("wte"), dwpe, 1);
  return loss;
}

// Each unit's buffer at least its numel long.
template <class T>
void size_grads(const FlatLayout& layout, const std::vector<std::vector<T>>& params,
                std::vector<std::vector<T>>& grads) {
  MP_ENFORCE_EQ(static_cast<int64_t>(params.size()), static_cast<int64_t>(layout.num_units()),
                "parameter buffers, one per unit");
  grads.resize(params.size());
  for (int u = 0; u < layout.num_units(); ++u) {
    const auto k = static_cast<size_t>(u);
    MP_ENFORCE_GE(static_cast<int64_t>(params[k].size()), layout.unit(u).numel, "unit ", layout.unit(u).name);
    if (static_cast<int64_t>(grads[k].size()) < layout.unit(u).numel) {
      grads[k].resize(static_cast<size_t>(layout.unit(u).numel));
    }
  }
}

// A source of exactly one micro-batch: the given tokens.
class OneBatch final : public TokenBatchSource {
 public:
  OneBatch(const GptConfig& c, const int32_t* inputs, const int32_t* targets) : c_(c), in_(inputs), tg_(targets) {}
  int64_t batch() const override { return c_.micro_batch_size; }
  int64_t context() const override { return c_.context; }
  void micro_batch(int64_t, int32_t* inputs, int32_t* targets) const override {
    const int64_t n = c_.micro_batch_size * c_.context;
    std::copy(in_, in_ + n, inputs);
    std::copy(tg_, tg_ + n, targets);
  }
  std::string describe() const override { return "one micro-batch"; }

 private:
  GptConfig c_;
  const int32_t *in_, *tg_;
};

}  // namespace

template <>
double gpt_loss_and_grads<double>(const GptConfig& config, const int32_t* inputs, const int32_t* targets,
                                  const std::vector<Vec>& unit_params, std::vector<Vec>& unit_grads) {
  const FlatLayout layout(Gpt::spec_for(config), 1);
  size_grads(layout, unit_params, unit_grads);
  return reference(config, inputs, targets, Params{layout, unit_params, unit_grads});
}

template <>
double gpt_loss_and_grads<float>(const GptConfig& config, const int32_t* inputs, const int32_t* targets,
                                 const std::vector<std::vector<float>>& unit_params,
                                 std::vector<std::vector<float>>& unit_grads) {
  const FlatLayout layout(Gpt::spec_for(config), 1);
  size_grads(layout, unit_params, unit_grads);
  Gpt model(config, Allocator(), std::make_shared<OneBatch>(config, inputs, targets));
  model.begin_micro_batch(0);
  auto wrap = [](const std::vector<float>& v) {
    return Tensor::wrap(const_cast<float*>(v.data()), Device::cpu(), DType::kF32, {static_cast<int64_t>(v.size())});
  };
  for (int u = 0; u < layout.num_units(); ++u) model.forward(u, wrap(unit_params[static_cast<size_t>(u)]));
  const double loss = model.loss();
  for (int u = layout.num_units() - 1; u >= 0; --u) {
    const auto k = static_cast<size_t>(u);
    model.backward(u, wrap(unit_params[k]), wrap(unit_grads[k]));
  }
  return loss;
}

}  // namespace mp

// The GPT (models/gpt.h): one model for every device. Each unit's math is
// written once below as ops on the engine's compute stream (kernels/nn/),
// whose CPU and CUDA bodies are the only device-specific code (Note [GPT on
// every device] in gpt.h).
#include "models/gpt.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/act.h"
#include "kernels/nn/attention.h"
#include "kernels/nn/cast.h"
#include "kernels/nn/embedding.h"
#include "kernels/nn/gemm.h"
#include "kernels/nn/layernorm.h"
#include "kernels/nn/loss.h"
#include "kernels/nn/residual.h"
#include "kernels/ops.h"
#include "models/flat_layout.h"
#include "models/gpt_workspace.h"

namespace mp {

using namespace gpt;  // NOLINT(build/namespaces): the model's own layout (models/gpt_workspace.h)

// A unit's parameters: all of them as fp32 (the engine's, or widened into
// the workspace), and the engine's buffer itself, whose bf16 GEMM weights
// (and wte, Plan::raw_bf16_wte) are read as they are.
struct Gpt::UnitParams {
  const float* p = nullptr;
  const void* raw = nullptr;
  DType raw_dtype = DType::kF32;
  const UnitLayout* layout = nullptr;

  int64_t offset(int param) const { return layout->params[static_cast<size_t>(param)].offset; }
  const float* at(int param) const { return p + offset(param); }
};

// ---- sizes ----------------------------------------------------------------------

namespace {

int64_t workspace_bytes(const Plan& p) {
  int64_t bytes = 0;
  carve(p, nullptr, &bytes);
  return bytes;
}

}  // namespace

int64_t Gpt::activation_bytes(const GptConfig& config, Device device, const GptOptions& options) {
  return workspace_bytes(plan_for(config, options, device));
}

int64_t Gpt::loss_chunk_rows(const GptConfig& config, Device device, const GptOptions& options) {
  return plan_for(config, options, device).chunk;
}

std::string Gpt::describe_kernels() const {
  const Plan& p = *plan_;
  if (p.device.is_cpu()) return "";
  std::string attention;
  for (size_t l = 0; l < p.attention.size(); ++l) {
    if (l == 0 || p.attention[l].note != p.attention[l - 1].note) {
      attention += std::string(attention.empty() ? "" : "; ") + "attention" +
                   (p.attention.size() > 1 && l > 0 ? " from block " + std::to_string(l) : "") + ": " +
                   p.attention[l].note;
    }
  }
  return attention + "; loss in chunks of " + std::to_string(p.chunk) + " rows";
}

bool Gpt::cudnn_attention(int64_t block) const {
  MP_ENFORCE(block >= 0 && block < plan_->layers, "block ", block, " of ", plan_->layers);
  return plan_->attention[static_cast<size_t>(block)].cudnn;
}

// ---- construction ---------------------------------------------------------------

Gpt::Gpt(const GptConfig& config, Allocator allocator, std::shared_ptr<const TokenBatchSource> source,
         GptOptions options)
    : StreamModel("Gpt", "the GPT"), config_(config), options_(options), spec_(spec_for(config)),
      layout_(FlatLayout(spec_, 1).units()),
      order_("Gpt", static_cast<int>(layout_.size())) {
  set_source(source ? std::move(source) : std::make_shared<GptData>(config));
  const Device device = allocator.device();
  set_current_device(device);  // the CUDA ops ask CUB for their scratch sizes
  plan_ = std::make_unique<Plan>(plan_for(config_, options_, device));
  int64_t bytes = workspace_bytes(*plan_);
  workspace_ = allocator.allocate(static_cast<size_t>(bytes), MemCategory::kActivations);
  b_ = std::make_unique<Buffers>(carve(*plan_, static_cast<char*>(workspace_.data()), &bytes));
  tokens_ = InputRing(device, static_cast<size_t>(2 * plan_->rows) * sizeof(int32_t));
  kept_host_ = PinnedBuffer(device, static_cast<size_t>(plan_->padded_vocab) * sizeof(float));
}

Gpt::~Gpt() {
  // Queued device work reads the workspace and the pinned buffers: let it
  // finish (direct calls on the CPU have waited for theirs).
  if (plan_) wait_for_device_idle(plan_->device);
}

Device Gpt::device() const { return plan_->device; }

void Gpt::set_source(std::shared_ptr<const TokenBatchSource> source) {
  MP_ENFORCE(source != nullptr, "Gpt token source");
  MP_ENFORCE(source->batch() == config_.micro_batch_size && source->context() == config_.context,
             "token source ", source->describe(), " gives batch ", source->batch(), " x context ", source->context(),
             "; the model takes ", config_.micro_batch_size, " x ", config_.context);
  source_ = std::move(source);
}

// ---- parameters -----------------------------------------------------------------

// The element ranges of unit u's parameters read as fp32 (widened into
// param_ws): all, except those read from the engine's bf16 buffer itself:
// in a block the weights of bf16 GEMMs when bf16 is stored as bf16
// (gemm_weight), in unit 0 wte (Plan::raw_bf16_wte). Note [GPT autocast].
nn::Ranges Gpt::fp32_ranges(int unit, DType params) const {
  const Plan& p = *plan_;
  const UnitLayout& layout = layout_[static_cast<size_t>(unit)];
  std::vector<int> skip;  // in offset order
  if (unit == 0 && p.raw_bf16_wte(params)) skip.push_back(kWte);
  if (unit > 0 && unit <= p.layers && p.bf16_storage == DType::kBF16 && params == DType::kBF16) {
    const size_t op = static_cast<size_t>(unit - 1) * kBlockOps;
    for (const auto& [param, o] :
         {std::pair{kAttnW, kCAttn}, {kAttnProjW, kAttnCProj}, {kFcW, kCFc}, {kFcProjW, kMlpCProj}}) {
      if (p.op_dtype[op + static_cast<size_t>(o)] == DType::kBF16) skip.push_back(param);
    }
  }
  nn::Ranges ranges;
  int64_t at = 0;
  for (int k : skip) {
    const ParamPlacement& pp = layout.params[static_cast<size_t>(k)];
    if (pp.offset > at) ranges.emplace_back(at, pp.offset);
    at = pp.offset + pp.numel;
  }
  if (layout.numel > at) ranges.emplace_back(at, layout.numel);
  return ranges;
}

Gpt::UnitParams Gpt::unit_params(const OpContext& cx, int unit, const Tensor& params) {
  const UnitLayout& layout = layout_[static_cast<size_t>(unit)];
  check_params(params, layout);
  const DType dtype = params.dtype();
  if (dtype == DType::kF32) return UnitParams{params.data_as<float>(), params.data(), dtype, &layout};
  nn::widen(cx, params, fp32_ranges(unit, dtype), b_->param_ws);
  return UnitParams{b_->param_ws, params.data(), dtype, &layout};
}

// Weight `param` of block op `op` as its GEMM input (Note [GPT autocast]):
// fp32, or bf16: the engine's bf16 values as they are (or their exact fp32
// copy where bf16 is stored as fp32), else the fp32 ones rounded into w16.
nn::Operand Gpt::gemm_weight(const OpContext& cx, const UnitParams& w, int param, size_t op) {
  if (!plan_->op_bf16(op)) return nn::fp32(w.at(param));
  if (w.raw_dtype == DType::kBF16) {
    if (plan_->bf16_storage == DType::kBF16) {
      return nn::Operand{static_cast<const bf16*>(w.raw) + w.offset(param), DType::kBF16};
    }
    return nn::Operand{w.at(param), DType::kF32};
  }
  const int64_t n = w.layout->params[static_cast<size_t>(param)].numel;
  return nn::round_to_bf16(cx, w.at(param), n, plan_->bf16_storage, b_->w16);
}

nn::Operand Gpt::residual_grad(size_t op) const {
  if (plan_->op_bf16(op)) return nn::Operand{b_->dres16, plan_->bf16_storage};
  return nn::fp32(b_->dres);
}

// ---- the units' math --------------------------------------------------------------
// Unit 0 is the embedding, units 1 .. layers the blocks, the last the head.
// Each GEMM is one op with its epilogue (kernels/nn/gemm.h): the bias, the
// residual add, the GELU and, backward, the bias gradients.

void Gpt::embed_forward(const OpContext& cx, const UnitParams& w) {
  const Plan& p = *plan_;
  const int64_t n = p.padded_vocab * p.channels;
  const bool raw = p.raw_bf16_wte(w.raw_dtype);
  const bf16* raw_wte = raw ? static_cast<const bf16*>(w.raw) + w.offset(kWte) : nullptr;
  // Note [Tied head]: the head's GEMM input form of wte, in place where the
  // engine keeps it, else a copy.
  const bool fp32_as_is = !p.bf16_head() && w.raw_dtype == DType::kF32;
  wte_head_ = b_->wte_head;
  if (params_persist_ && (raw || fp32_as_is)) {
    wte_head_ = raw ? static_cast<const void*>(raw_wte) : w.at(kWte);
  } else if (raw) {
    nn::copy(cx, b_->wte_head, raw_wte, n * static_cast<int64_t>(sizeof(bf16)), "head's copy of wte");
  } else if (p.bf16_head()) {
    nn::round_to_bf16(cx, w.at(kWte), n, p.bf16_storage, b_->wte_head);
  } else {
    nn::copy(cx, b_->wte_head, w.at(kWte), n * static_cast<int64_t>(sizeof(float)), "head's copy of wte");
  }
  nn::embedding_forward(cx, b_->tokens, raw ? static_cast<const void*>(raw_wte) : w.at(kWte),
                        raw ? DType::kBF16 : DType::kF32, w.at(kWpe), p.batch, p.seq, p.channels, p.vocab,
                        b_->residual[0]);
}

void Gpt::block_forward(const OpContext& cx, int unit, const UnitParams& w) {
  const Plan& p = *plan_;
  const auto l = static_cast<size_t>(unit - 1);
  const size_t op = l * kBlockOps;
  const Layer& y = b_->layers[l];
  const nn::GemmSettings gs{options_.allow_tf32, options_.deterministic};
  const int64_t rows = p.rows, c = p.channels;
  const float* x = b_->residual[l];
  float* out = b_->residual[l + 1];
  nn::layernorm_forward(cx, x, w.at(kLn1W), w.at(kLn1B), rows, c, y.ln1, y.ln1_mean, y.ln1_rstd, b_->ln_ws);
  nn::gemm(cx, gs,
           nn::linear_forward(nn::operand(y.ln1), gemm_weight(cx, w, kAttnW, op + kCAttn), w.at(kAttnB), rows, c,
                              3 * c, y.qkv),
           "c_attn forward");
  nn::attention_forward(cx, p.attention[l], y.qkv, y.atty, y.att_saved, b_->att_ws);
  // res2 := x + the attention branch, in the GEMM.
  nn::gemm(cx, gs,
           nn::linear_forward(nn::operand(y.atty), gemm_weight(cx, w, kAttnProjW, op + kAttnCProj), w.at(kAttnProjB),
                              rows, c, c, f32_act(y.res2), x),
           "attn.c_proj forward + residual");
  nn::layernorm_forward(cx, y.res2, w.at(kLn2W), w.at(kLn2B), rows, c, y.ln2, y.ln2_mean, y.ln2_rstd, b_->ln_ws);
  nn::gemm(cx, gs,
           nn::linear_forward(nn::operand(y.ln2), gemm_weight(cx, w, kFcW, op + kCFc), w.at(kFcB), rows, c, 4 * c,
                              y.fch_gelu, nullptr, y.fch),
           "c_fc forward + gelu");
  // out := res2 + the MLP branch, in the GEMM.
  nn::gemm(cx, gs,
           nn::linear_forward(nn::operand(y.fch_gelu), gemm_weight(cx, w, kFcProjW, op + kMlpCProj), w.at(kFcProjB),
                              rows, 4 * c, c, f32_act(out), y.res2),
           "mlp.c_proj forward + residual");
}

// Note [GPT loss]: ln_f, then per chunk of rows the logits, the classifier
// (d logits in place) and the head's backward GEMMs; the mean loss last.
void Gpt::head_forward(const OpContext& cx, const UnitParams& w) {
  const Plan& p = *plan_;
  nn::layernorm_forward(cx, b_->residual.back(), w.at(kLnfW), w.at(kLnfB), p.rows, p.channels, b_->lnf,
                        b_->lnf_mean, b_->lnf_rstd, b_->ln_ws);
  for (int64_t r0 = 0; r0 < p.rows; r0 += p.chunk) head_chunk(cx, r0, std::min(p.chunk, p.rows - r0));
  nn::mean_loss(cx, b_->row_loss, p.rows, b_->mean_loss);
  if (kept_row_ >= 0) {
    nn::copy_to_host(cx, kept_host_.data(), b_->kept, p.padded_vocab * 4, "kept logits row to the host");
    kept_written_ = true;
  }
  kept_all_written_ = p.keep_logits;
}

// Rows [r0, r0 + n) of the loss: logits [n, Vp] = x wte^T, the classifier
// (d logits in place), then d lnf [n, C] = d logits wte and, in chunks,
// d wte (+)= d logits^T x.
void Gpt::head_chunk(const OpContext& cx, int64_t r0, int64_t n) {
  const Plan& p = *plan_;
  const int64_t c = p.channels, vp = p.padded_vocab;
  const DType xdt = p.head_storage();
  const nn::GemmSettings gs{options_.allow_tf32, options_.deterministic};
  const Act logits = b_->logits, dlnf = b_->dlnf.at(r0 * c);
  const GemmInput x{b_->lnf.at(r0 * c).data, xdt, c, false}, wte{wte_head_, xdt, c, false},
      wte_t{wte_head_, xdt, c, true}, dlogits{logits.data, xdt, vp, false};
  // [n, Vp] = x wte^T
  nn::gemm(cx, gs, gemm_problem(n, vp, c, x, wte_t, logits.data, logits.dtype, logits.bf16), "logits");
  if (kept_row_ >= r0 && kept_row_ < r0 + n) {
    nn::convert(cx, logits.at((kept_row_ - r0) * vp), f32_act(b_->kept), vp, "kept logits row");
  }
  if (p.keep_logits) nn::convert(cx, logits, f32_act(b_->kept_all + r0 * vp), n * vp, "kept logits");
  nn::classifier(cx, logits, b_->tokens + p.rows + r0, n, p.vocab, vp, p.rows, b_->row_loss + r0);
  // [n, C] = d logits [n, Vp] wte [Vp, C]
  nn::gemm(cx, gs, gemm_problem(n, c, vp, dlogits, wte, dlnf.data, dlnf.dtype, dlnf.bf16), "head backward (d ln_f)");
  if (p.chunked()) head_dwte(cx, r0, n, b_->dwte_head);  // the chunk's d logits go next
}

// d wte [Vp, C] (+)= d logits^T [Vp, n] x [n, C] for rows [r0, r0 + n):
// overwritten by the first chunk, accumulated by the others.
void Gpt::head_dwte(const OpContext& cx, int64_t r0, int64_t n, float* dwte) {
  const Plan& p = *plan_;
  const DType xdt = p.head_storage();
  GemmProblem dw = gemm_problem(p.padded_vocab, p.channels, n, GemmInput{b_->logits.data, xdt, p.padded_vocab, true},
                                GemmInput{b_->lnf.at(r0 * p.channels).data, xdt, p.channels, false}, dwte);
  dw.accumulate = r0 > 0;
  nn::gemm(cx, nn::GemmSettings{options_.allow_tf32, options_.deterministic}, dw, "head backward (d wte)");
}

void Gpt::embed_backward(const OpContext& cx, float* g) {
  const Plan& p = *plan_;
  const UnitLayout& unit = layout_[0];
  float* dwte = g + unit.params[kWte].offset;
  float* dwpe = g + unit.params[kWpe].offset;
  // Note [Tied head]: the head's d wte (kept from the chunks, or from the
  // one chunk's d logits, which are still there), then the embedding's.
  if (p.chunked()) {
    nn::copy(cx, dwte, b_->dwte_head, p.padded_vocab * p.channels * 4, "head's d wte");
  } else {
    head_dwte(cx, 0, p.rows, dwte);
  }
  nn::zero(cx, dwpe, p.seq * p.channels * 4, "zero d wpe");
  nn::embedding_backward(cx, b_->tokens, b_->dres, p.batch, p.seq, p.channels, p.vocab, dwte, dwpe, b_->emb_ws,
                         b_->emb_ws_bytes);
}

// b.dres holds d loss / d (block output), and, where this block's
// mlp.c_proj is bf16, b.dres16 its bf16 copy; they become d loss / d
// (block input) (and its copy for the block before, where that one's
// mlp.c_proj is bf16).
void Gpt::block_backward(const OpContext& cx, int unit, const UnitParams& w, float* g) {
  const Plan& p = *plan_;
  const auto l = static_cast<size_t>(unit - 1);
  const size_t op = l * kBlockOps;
  const Layer& y = b_->layers[l];
  const BlockDtypes& d = p.blocks[l];
  Buffers& b = *b_;
  const nn::GemmSettings gs{options_.allow_tf32, options_.deterministic};
  const int64_t rows = p.rows, c = p.channels;
  auto grad = [&](int param) { return g + w.offset(param); };
  const Act dfch = p.act(b.dfch, d.fch), dln2 = p.act(b.dln, d.ln2), datty = p.act(b.datty, d.atty),
            dqkv = p.act(b.dqkv, d.qkv), dln1 = p.act(b.dln, d.ln1);
  // The MLP: d fch through the GELU, the weight and bias gradients, d ln_2.
  const nn::Operand dy_p = residual_grad(op + kMlpCProj);
  const nn::Operand w_p = gemm_weight(cx, w, kFcProjW, op + kMlpCProj);
  nn::gemm(cx, gs, nn::linear_backward_input(dy_p, w_p, rows, 4 * c, c, dfch, y.fch),
           "mlp.c_proj backward (d fch, through the gelu)");
  nn::gemm(cx, gs,
           nn::linear_backward_weight(nn::operand(y.fch_gelu), dy_p, rows, 4 * c, c, grad(kFcProjW), grad(kFcProjB)),
           "mlp.c_proj backward (d weight, d bias)");
  nn::gemm(cx, gs,
           nn::linear_backward_input(nn::operand(dfch), gemm_weight(cx, w, kFcW, op + kCFc), rows, c, 4 * c, dln2),
           "c_fc backward (d ln_2)");
  nn::gemm(cx, gs,
           nn::linear_backward_weight(nn::operand(y.ln2), nn::operand(dfch), rows, c, 4 * c, grad(kFcW), grad(kFcB)),
           "c_fc backward (d weight, d bias)");
  nn::layernorm_backward(cx, dln2, y.res2, w.at(kLn2W), y.ln2_mean, y.ln2_rstd, rows, c, b.dres, /*accumulate=*/true,
                         p.op_bf16(op + kAttnCProj) ? p.act(b.dres16, true) : Act{}, grad(kLn2W), grad(kLn2B),
                         b.ln_ws);
  // The attention.
  const nn::Operand dy_a = residual_grad(op + kAttnCProj);
  nn::gemm(cx, gs,
           nn::linear_backward_input(dy_a, gemm_weight(cx, w, kAttnProjW, op + kAttnCProj), rows, c, c, datty),
           "attn.c_proj backward (d attention output)");
  nn::gemm(cx, gs,
           nn::linear_backward_weight(nn::operand(y.atty), dy_a, rows, c, c, grad(kAttnProjW), grad(kAttnProjB)),
           "attn.c_proj backward (d weight, d bias)");
  nn::attention_backward(cx, p.attention[l], y.qkv, y.atty, y.att_saved, datty, b.att_ws, dqkv);
  nn::gemm(cx, gs,
           nn::linear_backward_input(nn::operand(dqkv), gemm_weight(cx, w, kAttnW, op + kCAttn), rows, c, 3 * c, dln1),
           "c_attn backward (d ln_1)");
  nn::gemm(cx, gs,
           nn::linear_backward_weight(nn::operand(y.ln1), nn::operand(dqkv), rows, c, 3 * c, grad(kAttnW),
                                      grad(kAttnB)),
           "c_attn backward (d weight, d bias)");
  // The block before reads dres16 where its mlp.c_proj is bf16.
  const bool copy = l > 0 && p.op_bf16(op - kBlockOps + kMlpCProj);
  nn::layernorm_backward(cx, dln1, b.residual[l], w.at(kLn1W), y.ln1_mean, y.ln1_rstd, rows, c, b.dres,
                         /*accumulate=*/true, copy ? p.act(b.dres16, true) : Act{}, grad(kLn1W), grad(kLn1B), b.ln_ws);
}

void Gpt::head_backward(const OpContext& cx, const UnitParams& w, float* g) {
  const Plan& p = *plan_;
  const bool copy = p.layers > 0 && p.op_bf16(static_cast<size_t>(p.layers - 1) * kBlockOps + kMlpCProj);
  nn::layernorm_backward(cx, b_->dlnf, b_->residual.back(), w.at(kLnfW), b_->lnf_mean, b_->lnf_rstd, p.rows,
                         p.channels, b_->dres, /*accumulate=*/false, copy ? p.act(b_->dres16, true) : Act{},
                         g + w.offset(kLnfW), g + w.offset(kLnfB), b_->ln_ws);
}

// ---- the Model calls --------------------------------------------------------------

void Gpt::begin_micro_batch_on(int64_t global_index, Stream& s) {
  check_stream(s);
  auto* host = static_cast<int32_t*>(tokens_.next());
  source_->micro_batch(global_index, host, host + plan_->rows);
  tokens_.send(b_->tokens, s);
  order_.begin();
}

void Gpt::forward_on(int unit, const Tensor& params, Stream& s) {
  order_.check_forward(unit);
  unit_ops(s, layout_[static_cast<size_t>(unit)], config_.threads, &timer_, [&](const OpContext& cx) {
    const UnitParams w = unit_params(cx, unit, params);
    if (unit == 0) {
      embed_forward(cx, w);
    } else if (unit <= config_.layers) {
      block_forward(cx, unit, w);
    } else {
      head_forward(cx, w);
    }
  });
  order_.forwarded();
}

bool Gpt::recomputes(int unit) const {
  return unit >= 1 && unit <= config_.layers && plan_->recomputed[static_cast<size_t>(unit - 1)];
}

// Note [GPT recomputation]: block unit - 1's forward again, into the scratch
// its backward reads next.
void Gpt::recompute_on(int unit, const Tensor& params, Stream& s) {
  order_.check_recompute(unit);
  MP_ENFORCE(recomputes(unit), "Gpt::recompute of unit ", layout_[static_cast<size_t>(unit)].name,
             ", which keeps its activations (GptOptions::recompute_every = ", options_.recompute_every, ")");
  unit_ops(s, layout_[static_cast<size_t>(unit)], config_.threads, &timer_,
           [&](const OpContext& cx) { block_forward(cx, unit, unit_params(cx, unit, params)); });
  order_.recomputed(unit);
}

void Gpt::enqueue_loss(double* loss, Stream& s) const {
  order_.after_forward("loss");
  ops::copy_bytes(loss, Device::cpu(), b_->mean_loss, plan_->device, sizeof(double), s);
}

void Gpt::backward_on(int unit, const Tensor& params, const Tensor& grads, Stream& s) {
  order_.check_backward(unit);
  if (recomputes(unit)) order_.check_recomputed(unit);
  check_grads(grads, layout_[static_cast<size_t>(unit)]);
  float* g = grads.data_as<float>();
  unit_ops(s, layout_[static_cast<size_t>(unit)], config_.threads, &timer_, [&](const OpContext& cx) {
    if (unit == 0) {
      embed_backward(cx, g);  // reads no parameters (Note [Tied head])
    } else {
      const UnitParams w = unit_params(cx, unit, params);
      if (unit <= config_.layers) {
        block_backward(cx, unit, w, g);
      } else {
        head_backward(cx, w, g);
      }
    }
  });
  order_.backwarded();
}

void Gpt::keep_logits_row(int64_t row) {
  MP_ENFORCE(row >= -1 && row < plan_->rows, "logits row ", row, " of ", plan_->rows);
  kept_row_ = row;
  kept_written_ = false;
}

std::vector<float> Gpt::kept_logits() const {
  MP_ENFORCE(kept_row_ >= 0 && kept_written_, "Gpt::kept_logits without keep_logits_row and a whole forward");
  const float* row = kept_host_.as<float>();
  return std::vector<float>(row, row + plan_->padded_vocab);
}

void Gpt::flush_profile() { timer_.flush(); }

// ---- tests' views (CPU) ------------------------------------------------------------

const int32_t* Gpt::inputs() const {
  MP_ENFORCE(plan_->device.is_cpu() && order_.loaded(), "Gpt::inputs of a loaded micro-batch on the CPU");
  return b_->tokens;
}
const int32_t* Gpt::targets() const { return inputs() + plan_->rows; }

const float* Gpt::logits() const {
  MP_ENFORCE(plan_->device.is_cpu(), "Gpt::logits of a GPT on the CPU");
  order_.after_forward("logits");
  MP_ENFORCE(plan_->keep_logits && kept_all_written_, "Gpt::logits without GptOptions::keep_logits");
  return b_->kept_all;
}

}  // namespace mp

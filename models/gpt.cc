#include "models/gpt.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/convert.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gpt_ops.h"
#include "kernels/op_profile.h"
#include "models/model_util.h"
#include "core/error.h"
#include "models/flat_layout.h"
#include "core/parallel.h"

namespace mp {

// ---- workspace ----------------------------------------------------------------

namespace {

struct GptDims {
  int64_t batch = 0, seq = 0, channels = 0, heads = 0, layers = 0, vocab = 0, padded_vocab = 0;
  int64_t rows = 0;  // batch * seq
  int threads = 0;
  // Note [GPT autocast], float path only: the input dtype of GEMM op i
  // (block l's ops are 4 l .. 4 l + 3 in kBlockOp order, the head last),
  // and how bf16 inputs are stored (gemm_bf16_storage()).
  std::vector<DType> op_dtype;
  DType bf16_storage = DType::kF32;
  bool any_bf16_op() const {
    return std::find(op_dtype.begin(), op_dtype.end(), DType::kBF16) != op_dtype.end();
  }
  DType head_dtype() const { return op_dtype.empty() ? DType::kF32 : op_dtype.back(); }
};

enum BlockOp { kCAttn = 0, kAttnCProj, kCFc, kMlpCProj, kBlockOps };

// Only the float path rounds GEMM inputs to bf16; the double path is the
// exact reference (Note [GPT autocast]).
template <class T>
GptDims dims_for(const GptConfig& c) {
  GptDims d;
  d.batch = c.micro_batch_size;
  d.seq = c.context;
  d.channels = c.channels;
  d.heads = c.heads;
  d.layers = c.layers;
  d.vocab = c.vocab;
  d.padded_vocab = gpt_padded_vocab(c.vocab);
  d.rows = d.batch * d.seq;
  d.threads = c.threads;
  if constexpr (std::is_same_v<T, float>) {
    d.op_dtype = gpt_matmul_op_dtypes(c);
    d.bf16_storage = gemm_bf16_storage();
  } else {
    d.op_dtype.assign(static_cast<size_t>(kBlockOps * c.layers + 1), DType::kF32);
  }
  return d;
}

// Every activation the backward reads, and the backward's scratch.
template <class T>
struct GptBuffers {
  struct Layer {
    T *ln1, *ln1_mean, *ln1_rstd;  // ln_1 output [rows, C], its mean and rstd [rows]
    T *qkv, *att, *atty;           // c_attn output [rows, 3C], probabilities [B, NH, T, T], att v [rows, C]
    T* res2;                       // x + attention branch [rows, C]
    T *ln2, *ln2_mean, *ln2_rstd;
    T *fch, *fch_gelu;  // c_fc output and its gelu [rows, 4C]
  };
  std::vector<T*> residual;  // layers + 1: [0] the embeddings, [l + 1] block l's output [rows, C]
  std::vector<Layer> layers;
  T *lnf, *lnf_mean, *lnf_rstd;
  T *logits, *row_loss;  // [rows, Vp], [rows]
  // Note [Tied head]: [Vp, C], the head's GEMM input: T, or for a bf16
  // head its bf16 values in the dims' bf16_storage.
  T* wte;
  // Backward scratch, shared by the layers. dres is d loss / d residual stream.
  T *dres, *dln, *datty, *dqkv, *dfch, *dlogits, *att_scratch;
  // bf16 GEMM inputs (Note [GPT autocast]), in bf16_storage; null without
  // bf16 ops. x16[i]: GEMM op i's activation input, rounded once by the
  // forward and read again by the backward (null where op i is fp32);
  // dlogits16: a bf16 head's d logits, written by the loss and read by the
  // backward of the head and of unit 0 (Note [Tied head]); dy16: a block's
  // gradient; w16: a weight.
  std::vector<void*> x16;
  void *dlogits16 = nullptr, *dy16 = nullptr, *w16 = nullptr;
};

// Hands out consecutive 64-byte aligned ranges of one buffer; with a null
// base it only counts.
template <class T>
class Carver {
 public:
  explicit Carver(T* base) : base_(base) {}
  T* take(int64_t n) {
    T* p = base_ == nullptr ? nullptr : base_ + used_;
    constexpr auto kAlign = static_cast<int64_t>(64 / sizeof(T));
    used_ += (n + kAlign - 1) / kAlign * kAlign;
    return p;
  }
  int64_t used() const { return used_; }

 private:
  T* base_;
  int64_t used_ = 0;
};

// The buffers carved from `base` (null: only count); *numel := elements used.
template <class T>
GptBuffers<T> carve(const GptDims& d, T* base, int64_t* numel) {
  Carver<T> k(base);
  const int64_t nc = d.rows * d.channels;
  GptBuffers<T> b;
  b.residual.push_back(k.take(nc));
  for (int64_t l = 0; l < d.layers; ++l) {
    typename GptBuffers<T>::Layer y{};
    y.ln1 = k.take(nc);
    y.ln1_mean = k.take(d.rows);
    y.ln1_rstd = k.take(d.rows);
    y.qkv = k.take(3 * nc);
    y.att = k.take(d.batch * d.heads * d.seq * d.seq);
    y.atty = k.take(nc);
    y.res2 = k.take(nc);
    y.ln2 = k.take(nc);
    y.ln2_mean = k.take(d.rows);
    y.ln2_rstd = k.take(d.rows);
    y.fch = k.take(4 * nc);
    y.fch_gelu = k.take(4 * nc);
    b.layers.push_back(y);
    b.residual.push_back(k.take(nc));
  }
  b.lnf = k.take(nc);
  b.lnf_mean = k.take(d.rows);
  b.lnf_rstd = k.take(d.rows);
  b.logits = k.take(d.rows * d.padded_vocab);
  b.row_loss = k.take(d.rows);
  b.wte = k.take(d.padded_vocab * d.channels);
  b.dres = k.take(nc);
  b.dln = k.take(nc);
  b.datty = k.take(nc);
  b.dqkv = k.take(3 * nc);
  b.dfch = k.take(4 * nc);
  b.dlogits = k.take(d.rows * d.padded_vocab);
  b.att_scratch = k.take(d.batch * d.heads * d.seq);
  if (d.any_bf16_op()) {
    // Sized for fp32 storage, which bf16 storage never exceeds.
    // Op i's input: [rows, C] except the MLP projection's [rows, 4C].
    for (size_t i = 0; i < d.op_dtype.size(); ++i) {
      const bool mlp_proj = i + 1 < d.op_dtype.size() && i % kBlockOps == kMlpCProj;
      b.x16.push_back(d.op_dtype[i] == DType::kBF16 ? static_cast<void*>(k.take(mlp_proj ? 4 * nc : nc)) : nullptr);
    }
    if (d.head_dtype() == DType::kBF16) b.dlogits16 = k.take(d.rows * d.padded_vocab);
    b.dy16 = k.take(4 * nc);
    b.w16 = k.take(4 * d.channels * d.channels);
  }
  *numel = k.used();
  return b;
}

// ---- units --------------------------------------------------------------------
// Unit 0 is the embedding, units 1 .. layers the blocks, the last the head.
// Parameters are read at their offsets in the unit's flat buffer, in the
// order spec_for declares them.

enum EmbedParam { kWte = 0, kWpe };
enum BlockParam {
  kLn1W = 0, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB
};
enum HeadParam { kLnfW = 0, kLnfB };

int64_t offset(const UnitLayout& unit, int param) { return unit.params[static_cast<size_t>(param)].offset; }

// A unit's parameters: all of them as T, and the tensor the engine handed
// over when that was converted (bf16 weights feed bf16 GEMMs as they are).
template <class T>
struct UnitParams {
  const T* p = nullptr;
  const void* raw = nullptr;  // null: the parameters are p itself
  DType raw_dtype = DType::kF32;
};

// ---- GEMM ops under Note [GPT autocast] ----------------------------------------
// For T = double every op is the plain loop; for float, op i's inputs are
// fp32 or rounded to bf16 by d.op_dtype[i].

// The bf16 input of a weight of n elements at offset `off`: the engine's
// bf16 values where it handed bf16 (or their exact fp32 copy in p, when
// gemm_cpu multiplies bf16 as fp32), else p rounded into b.w16.
template <class T>
GptGemmInput bf16_weight(const GptDims& d, const GptBuffers<T>& b, const UnitParams<T>& w, int64_t off,
                         int64_t n) {
  if (w.raw != nullptr && w.raw_dtype == DType::kBF16) {
    if (d.bf16_storage == DType::kBF16) return GptGemmInput{static_cast<const bf16*>(w.raw) + off, DType::kBF16};
    return gemm_input(w.p + off);
  }
  return gpt_round_to_bf16(w.p + off, n, d.bf16_storage, b.w16, d.threads);
}

// y = x w + bias for block op `op`, w and bias at offsets of the unit.
template <class T>
void matmul_forward(const GptDims& d, const GptBuffers<T>& b, size_t op, const UnitParams<T>& w, int64_t w_off,
                    int64_t bias_off, const T* x, int64_t in, int64_t out, T* y) {
  const T* bias = w.p + bias_off;
  if constexpr (std::is_same_v<T, float>) {
    if (d.op_dtype[op] == DType::kBF16) {
      const GptGemmInput x16 = gpt_round_to_bf16(x, d.rows * in, d.bf16_storage, b.x16[op], d.threads);
      gpt_matmul_forward(x16, bf16_weight(d, b, w, w_off, in * out), bias, d.rows, in, out, y, d.threads);
      return;
    }
  }
  gpt_matmul_forward(x, w.p + w_off, bias, d.rows, in, out, y, d.threads);
}

// dx = dy w^T, dw = x^T dy, db = column sums of dy for block op `op`.
template <class T>
void matmul_backward(const GptDims& d, const GptBuffers<T>& b, size_t op, const UnitParams<T>& w, int64_t w_off,
                     const T* x, const T* dy, int64_t in, int64_t out, T* dx, T* dw, T* db) {
  if constexpr (std::is_same_v<T, float>) {
    if (d.op_dtype[op] == DType::kBF16) {
      const GptGemmInput x16{b.x16[op], d.bf16_storage};  // the forward's rounding of x
      const GptGemmInput dy16 = gpt_round_to_bf16(dy, d.rows * out, d.bf16_storage, b.dy16, d.threads);
      gpt_matmul_backward(x16, bf16_weight(d, b, w, w_off, in * out), dy16, d.rows, in, out, dx, dw, d.threads);
      gpt_bias_backward(dy, d.rows, out, db, d.threads);
      return;
    }
  }
  gpt_matmul_backward(x, w.p + w_off, dy, d.rows, in, out, dx, dw, db, d.threads);
}

// logits = lnf wte^T, with b.wte already in the head's input form.
template <class T>
void logits_forward(const GptDims& d, const GptBuffers<T>& b) {
  if constexpr (std::is_same_v<T, float>) {
    if (d.head_dtype() == DType::kBF16) {
      const GptGemmInput x16 =
          gpt_round_to_bf16(b.lnf, d.rows * d.channels, d.bf16_storage, b.x16.back(), d.threads);
      gpt_logits_forward(x16, GptGemmInput{b.wte, d.bf16_storage}, d.rows, d.channels, d.padded_vocab, b.logits,
                         d.threads);
      return;
    }
  }
  gpt_logits_forward(b.lnf, b.wte, d.rows, d.channels, d.padded_vocab, b.logits, d.threads);
}

// The head's backward products (Note [Tied head]): dln = dlogits wte when
// dln is given (the head's backward), dwte = dlogits^T lnf when dwte is
// (unit 0's, into its gradients). dlogits as the loss left it.
template <class T>
void logits_backward(const GptDims& d, const GptBuffers<T>& b, T* dln, T* dwte) {
  if constexpr (std::is_same_v<T, float>) {
    if (d.head_dtype() == DType::kBF16) {
      const GptGemmInput x16{b.x16.back(), d.bf16_storage};        // the forward's rounding of lnf
      const GptGemmInput dlogits16{b.dlogits16, d.bf16_storage};  // the loss wrote it (unit_forward)
      gpt_logits_backward(x16, GptGemmInput{b.wte, d.bf16_storage}, dlogits16, d.rows, d.channels, d.padded_vocab,
                          dln, dwte, d.threads);
      return;
    }
  }
  gpt_logits_backward(b.lnf, b.wte, b.dlogits, d.rows, d.channels, d.padded_vocab, dln, dwte, d.threads);
}

// Whether unit 0 reads wte from the engine's bf16 parameters themselves:
// bf16 parameters, a bf16 head and native bf16 GEMMs, where the head's input
// form of wte is those bits and the embedding widens only the rows it reads.
// Gpt::fp32_ranges then leaves wte out of the fp32 copy.
bool raw_bf16_wte(const GptDims& d, DType params) {
  return params == DType::kBF16 && d.bf16_storage == DType::kBF16 && d.head_dtype() == DType::kBF16;
}

// b.wte := the head's GEMM input form of wte (Note [Tied head]).
template <class T>
void keep_head_wte(const GptDims& d, const GptBuffers<T>& b, const T* wte, const UnitParams<T>& w, int64_t off) {
  const int64_t n = d.padded_vocab * d.channels;
  if constexpr (std::is_same_v<T, float>) {
    if (w.raw != nullptr && raw_bf16_wte(d, w.raw_dtype)) {
      ScopedOp op(OpFamily::kElementwise);  // a copy of the bf16 bits the fp32 path would round back to
      const bf16* src = static_cast<const bf16*>(w.raw) + off;
      bf16* dst = reinterpret_cast<bf16*>(b.wte);
      parallel_for(n, d.threads, int64_t{1} << 16,
                   [&](int64_t i0, int64_t i1) { std::copy(src + i0, src + i1, dst + i0); });
      return;
    }
    if (d.head_dtype() == DType::kBF16) {
      gpt_round_to_bf16(wte, n, d.bf16_storage, b.wte, d.threads);
      return;
    }
  }
  ScopedOp op(OpFamily::kElementwise);
  parallel_for(n, d.threads, int64_t{1} << 16,
               [&](int64_t i0, int64_t i1) { std::copy(wte + i0, wte + i1, b.wte + i0); });
}

// Returns the loss after the head, 0 before.
template <class T>
double unit_forward(const GptDims& d, const GptBuffers<T>& b, int u, const UnitLayout& unit, const UnitParams<T>& w,
                    const int32_t* inputs, const int32_t* targets) {
  const int64_t rows = d.rows, c = d.channels;
  const int th = d.threads;
  const T* p = w.p;
  if (u == 0) {
    keep_head_wte(d, b, p + offset(unit, kWte), w, offset(unit, kWte));
    if constexpr (std::is_same_v<T, float>) {
      if (w.raw != nullptr && raw_bf16_wte(d, w.raw_dtype)) {
        gpt_embedding_forward(inputs, static_cast<const bf16*>(w.raw) + offset(unit, kWte), p + offset(unit, kWpe),
                              d.batch, d.seq, c, d.vocab, b.residual[0], th);
        return 0.0;
      }
    }
    gpt_embedding_forward(inputs, p + offset(unit, kWte), p + offset(unit, kWpe), d.batch, d.seq, c, d.vocab,
                          b.residual[0], th);
    return 0.0;
  }
  if (u <= d.layers) {
    const auto l = static_cast<size_t>(u - 1);
    const size_t op = l * kBlockOps;
    const typename GptBuffers<T>::Layer& y = b.layers[l];
    const T* x = b.residual[l];
    T* out = b.residual[l + 1];
    auto at = [&](int param) { return p + offset(unit, param); };
    auto off = [&](int param) { return offset(unit, param); };
    gpt_layernorm_forward(x, at(kLn1W), at(kLn1B), rows, c, y.ln1, y.ln1_mean, y.ln1_rstd, th);
    matmul_forward(d, b, op + kCAttn, w, off(kAttnW), off(kAttnB), y.ln1, c, 3 * c, y.qkv);
    gpt_attention_forward(y.qkv, d.batch, d.seq, c, d.heads, y.att, y.atty, th);
    matmul_forward(d, b, op + kAttnCProj, w, off(kAttnProjW), off(kAttnProjB), y.atty, c, c, y.res2);
    gpt_add(x, y.res2, rows * c, y.res2, th);
    gpt_layernorm_forward(y.res2, at(kLn2W), at(kLn2B), rows, c, y.ln2, y.ln2_mean, y.ln2_rstd, th);
    matmul_forward(d, b, op + kCFc, w, off(kFcW), off(kFcB), y.ln2, c, 4 * c, y.fch);
    gpt_gelu_forward(y.fch, rows * 4 * c, y.fch_gelu, th);
    matmul_forward(d, b, op + kMlpCProj, w, off(kFcProjW), off(kFcProjB), y.fch_gelu, 4 * c, c, out);
    gpt_add(y.res2, out, rows * c, out, th);
    return 0.0;
  }
  gpt_layernorm_forward(b.residual.back(), p + offset(unit, kLnfW), p + offset(unit, kLnfB), rows, c, b.lnf,
                        b.lnf_mean, b.lnf_rstd, th);
  logits_forward(d, b);
  // d loss / d logits lands where the backward reads it: b.dlogits, or for
  // a bf16 head only its bf16 rounding, in b.dlogits16.
  if constexpr (std::is_same_v<T, float>) {
    if (d.head_dtype() == DType::kBF16) {
      return gpt_softmax_xent_bf16(b.logits, targets, rows, d.vocab, d.padded_vocab, b.row_loss, b.dlogits,
                                   d.bf16_storage, b.dlogits16, th);
    }
  }
  return gpt_softmax_xent(b.logits, targets, rows, d.vocab, d.padded_vocab, b.row_loss, b.dlogits, th);
}

// w.p may be null for unit 0, which reads no parameters.
template <class T>
void unit_backward(const GptDims& d, const GptBuffers<T>& b, int u, const UnitLayout& unit, const UnitParams<T>& w,
                   const int32_t* inputs, T* g) {
  const int64_t rows = d.rows, c = d.channels;
  const int th = d.threads;
  const T* p = w.p;
  if (u == 0) {
    // Note [Tied head]: the head's d wte, then the embedding's added in.
    T* dwte = g + offset(unit, kWte);
    T* dwpe = g + offset(unit, kWpe);
    logits_backward(d, b, static_cast<T*>(nullptr), dwte);
    {
      ScopedOp op(OpFamily::kElementwise);
      std::fill(dwpe, dwpe + d.seq * c, T(0));
    }
    gpt_embedding_backward(inputs, b.dres, d.batch, d.seq, c, dwte, dwpe, th);
    return;
  }
  if (u <= d.layers) {
    const auto l = static_cast<size_t>(u - 1);
    const size_t op = l * kBlockOps;
    const typename GptBuffers<T>::Layer& y = b.layers[l];
    auto at = [&](int param) { return p + offset(unit, param); };
    auto off = [&](int param) { return offset(unit, param); };
    auto grad = [&](int param) { return g + offset(unit, param); };
    // b.dres holds d loss / d (block output); it becomes d loss / d (block input).
    matmul_backward(d, b, op + kMlpCProj, w, off(kFcProjW), y.fch_gelu, b.dres, 4 * c, c, b.dfch, grad(kFcProjW),
                    grad(kFcProjB));
    gpt_gelu_backward(y.fch, b.dfch, rows * 4 * c, b.dfch, th);
    matmul_backward(d, b, op + kCFc, w, off(kFcW), y.ln2, b.dfch, c, 4 * c, b.dln, grad(kFcW), grad(kFcB));
    gpt_layernorm_backward(b.dln, y.res2, at(kLn2W), y.ln2_mean, y.ln2_rstd, rows, c, b.dres, grad(kLn2W),
                           grad(kLn2B), th);
    matmul_backward(d, b, op + kAttnCProj, w, off(kAttnProjW), y.atty, b.dres, c, c, b.datty, grad(kAttnProjW),
                    grad(kAttnProjB));
    gpt_attention_backward(y.qkv, y.att, b.datty, d.batch, d.seq, c, d.heads, b.att_scratch, b.dqkv, th);
    matmul_backward(d, b, op + kCAttn, w, off(kAttnW), y.ln1, b.dqkv, c, 3 * c, b.dln, grad(kAttnW), grad(kAttnB));
    gpt_layernorm_backward(b.dln, b.residual[l], at(kLn1W), y.ln1_mean, y.ln1_rstd, rows, c, b.dres, grad(kLn1W),
                           grad(kLn1B), th);
    return;
  }
  logits_backward(d, b, b.dln, static_cast<T*>(nullptr));
  {
    ScopedOp op(OpFamily::kElementwise);
    std::fill(b.dres, b.dres + rows * c, T(0));
  }
  gpt_layernorm_backward(b.dln, b.residual.back(), p + offset(unit, kLnfW), b.lnf_mean, b.lnf_rstd, rows, c, b.dres,
                         g + offset(unit, kLnfW), g + offset(unit, kLnfB), th);
}

}  // namespace

namespace detail {
struct GptWorkspace {
  GptDims dims;
  GptBuffers<float> buffers;
};
}  // namespace detail

// ---- whole model on flat buffers ---------------------------------------------

template <class T>
double gpt_loss_and_grads(const GptConfig& config, const int32_t* inputs, const int32_t* targets,
                          const std::vector<std::vector<T>>& unit_params, std::vector<std::vector<T>>& unit_grads) {
  const FlatLayout layout(Gpt::spec_for(config), 1);
  const GptDims d = dims_for<T>(config);
  MP_ENFORCE_EQ(static_cast<int64_t>(unit_params.size()), static_cast<int64_t>(layout.num_units()),
                "parameter buffers, one per unit");
  unit_grads.resize(unit_params.size());
  for (int u = 0; u < layout.num_units(); ++u) {
    const auto k = static_cast<size_t>(u);
    MP_ENFORCE_GE(static_cast<int64_t>(unit_params[k].size()), layout.unit(u).numel, "unit ", layout.unit(u).name);
    if (static_cast<int64_t>(unit_grads[k].size()) < layout.unit(u).numel) {
      unit_grads[k].resize(static_cast<size_t>(layout.unit(u).numel));
    }
  }
  int64_t numel = 0;
  carve<T>(d, nullptr, &numel);
  std::vector<T> ws(static_cast<size_t>(numel));
  const GptBuffers<T> b = carve<T>(d, ws.data(), &numel);
  double loss = 0.0;
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitParams<T> w{unit_params[static_cast<size_t>(u)].data()};
    loss = unit_forward(d, b, u, layout.unit(u), w, inputs, targets);
  }
  for (int u = layout.num_units() - 1; u >= 0; --u) {
    const auto k = static_cast<size_t>(u);
    unit_backward(d, b, u, layout.unit(u), UnitParams<T>{unit_params[k].data()}, inputs, unit_grads[k].data());
  }
  return loss;
}

template double gpt_loss_and_grads<float>(const GptConfig&, const int32_t*, const int32_t*,
                                          const std::vector<std::vector<float>>&,
                                          std::vector<std::vector<float>>&);
template double gpt_loss_and_grads<double>(const GptConfig&, const int32_t*, const int32_t*,
                                           const std::vector<std::vector<double>>&,
                                           std::vector<std::vector<double>>&);

// ---- the model ----------------------------------------------------------------

ModelSpec Gpt::spec_for(const GptConfig& config) {
  validate(config);
  using Kind = ParamInit::Kind;
  const int64_t c = config.channels;
  const ParamInit ones{Kind::kOnes, 0.0}, zeros{Kind::kZeros, 0.0}, normal{Kind::kNormal, 0.02};
  const ParamInit residual{Kind::kNormal, 0.02 / std::sqrt(2.0 * static_cast<double>(config.layers))};
  ModelSpec spec;
  spec.units.push_back(UnitSpec{"embed",
                                {ParamSpec{"wte", {gpt_padded_vocab(config.vocab), c}, normal},
                                 ParamSpec{"wpe", {config.context, c}, normal}},
                                /*backward_reads_params=*/false});  // Note [Tied head]
  for (int64_t l = 0; l < config.layers; ++l) {
    const std::string h = "h" + std::to_string(l);
    // Declaration order is the BlockParam order.
    spec.units.push_back(UnitSpec{h,
                                  {ParamSpec{h + ".ln_1.weight", {c}, ones},
                                   ParamSpec{h + ".ln_1.bias", {c}, zeros},
                                   ParamSpec{h + ".attn.c_attn.weight", {c, 3 * c}, normal},
                                   ParamSpec{h + ".attn.c_attn.bias", {3 * c}, zeros},
                                   ParamSpec{h + ".attn.c_proj.weight", {c, c}, residual},
                                   ParamSpec{h + ".attn.c_proj.bias", {c}, zeros},
                                   ParamSpec{h + ".ln_2.weight", {c}, ones},
                                   ParamSpec{h + ".ln_2.bias", {c}, zeros},
                                   ParamSpec{h + ".mlp.c_fc.weight", {c, 4 * c}, normal},
                                   ParamSpec{h + ".mlp.c_fc.bias", {4 * c}, zeros},
                                   ParamSpec{h + ".mlp.c_proj.weight", {4 * c, c}, residual},
                                   ParamSpec{h + ".mlp.c_proj.bias", {c}, zeros}}});
  }
  spec.units.push_back(UnitSpec{"head", {ParamSpec{"ln_f.weight", {c}, ones}, ParamSpec{"ln_f.bias", {c}, zeros}}});
  return spec;
}

int64_t Gpt::activation_bytes(const GptConfig& config) {
  const GptDims d = dims_for<float>(config);
  int64_t numel = 0;
  carve<float>(d, nullptr, &numel);
  int64_t max_numel = 0;
  const FlatLayout layout(spec_for(config), 1);
  for (const UnitLayout& unit : layout.units()) max_numel = std::max(max_numel, unit.numel);
  return static_cast<int64_t>(sizeof(float)) * (numel + max_numel) +
         static_cast<int64_t>(sizeof(int32_t)) * 2 * d.rows;
}

Gpt::Gpt(const GptConfig& config, Allocator allocator, std::shared_ptr<const TokenBatchSource> source)
    : config_(config), spec_(spec_for(config)), layout_(FlatLayout(spec_, 1).units()) {
  set_source(source ? std::move(source) : std::make_shared<GptData>(config));
  auto ws = std::make_unique<detail::GptWorkspace>();
  ws->dims = dims_for<float>(config_);
  int64_t numel = 0;
  carve<float>(ws->dims, nullptr, &numel);
  workspace_ = Tensor::empty(allocator, DType::kF32, {numel}, MemCategory::kActivations);
  ws->buffers = carve<float>(ws->dims, workspace_.data_as<float>(), &numel);
  ws_ = std::move(ws);
  int64_t max_numel = 0;
  for (const UnitLayout& unit : layout_) max_numel = std::max(max_numel, unit.numel);
  param_ws_ = Tensor::empty(allocator, DType::kF32, {max_numel}, MemCategory::kActivations);
  const int64_t tokens = config_.micro_batch_size * config_.context;
  tokens_ = allocator.allocate(static_cast<size_t>(2 * tokens) * sizeof(int32_t), MemCategory::kActivations);
}

Gpt::~Gpt() = default;

const int32_t* Gpt::inputs() const { return static_cast<const int32_t*>(tokens_.data()); }
const int32_t* Gpt::targets() const { return inputs() + config_.micro_batch_size * config_.context; }

void Gpt::set_source(std::shared_ptr<const TokenBatchSource> source) {
  MP_ENFORCE(source != nullptr, "Gpt token source");
  MP_ENFORCE(source->batch() == config_.micro_batch_size && source->context() == config_.context,
             "token source ", source->describe(), " gives batch ", source->batch(), " x context ", source->context(),
             "; the model takes ", config_.micro_batch_size, " x ", config_.context);
  source_ = std::move(source);
}

void Gpt::begin_micro_batch(int64_t global_index) {
  auto* in = static_cast<int32_t*>(tokens_.data());
  source_->micro_batch(global_index, in, in + config_.micro_batch_size * config_.context);
  micro_batch_ = global_index;
  forwarded_ = 0;
  next_backward_ = -1;
}

void Gpt::check_unit(int unit, const char* what) const {
  MP_ENFORCE(micro_batch_ >= 0, "Gpt::", what, " before begin_micro_batch");
  MP_ENFORCE(unit >= 0 && unit < static_cast<int>(layout_.size()), "Gpt::", what, " of unit ", unit, " of ",
             layout_.size());
}

// The element ranges of unit u's parameters that are read as fp32 (the
// widened copy in param_ws_): all of them, except those read from the
// engine's bf16 buffer itself (bf16 parameters, native bf16 GEMMs): in a
// block the weights of bf16 GEMMs (bf16_weight), in unit 0 wte with a bf16
// head (raw_bf16_wte). Note [GPT autocast].
std::vector<std::pair<int64_t, int64_t>> Gpt::fp32_ranges(int unit, DType params) const {
  const UnitLayout& layout = layout_[static_cast<size_t>(unit)];
  const GptDims& d = ws_->dims;
  std::vector<int> skip;  // parameters read from the bf16 buffer itself, in offset order
  if (unit == 0 && raw_bf16_wte(d, params)) skip.push_back(kWte);  // keep_head_wte, the embedding
  if (unit > 0 && unit <= d.layers && d.bf16_storage == DType::kBF16 && params == DType::kBF16) {
    const size_t op = static_cast<size_t>(unit - 1) * kBlockOps;
    for (const auto& [param, o] : {std::pair{kAttnW, kCAttn}, {kAttnProjW, kAttnCProj}, {kFcW, kCFc}, {kFcProjW, kMlpCProj}}) {
      if (d.op_dtype[op + static_cast<size_t>(o)] == DType::kBF16) skip.push_back(param);
    }
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t at = 0;
  for (int k : skip) {
    const ParamPlacement& p = layout.params[static_cast<size_t>(k)];
    if (p.offset > at) ranges.emplace_back(at, p.offset);
    at = p.offset + p.numel;
  }
  if (layout.numel > at) ranges.emplace_back(at, layout.numel);
  return ranges;
}

const float* Gpt::unit_params(int unit, const Tensor& params) {
  const UnitLayout& layout = layout_[static_cast<size_t>(unit)];
  const bool narrow = params.dtype() == DType::kBF16 || params.dtype() == DType::kF16;
  if (!narrow || !params.device().is_cpu() || params.shape().size() != 1 || params.numel() < layout.numel) {
    return unit_params_fp32(layout, params, param_ws_);  // as it is, or the error naming the unit
  }
  // Narrow parameters: the same conversion, of the ranges read as fp32 only
  // (a bf16 GEMM weight is not widened: no cast of the same weights twice),
  // split over the op threads. Element-wise, so the bits do not depend on
  // the split.
  ScopedOp op(OpFamily::kCast);
  constexpr int64_t kChunk = int64_t{1} << 16;
  for (const auto& [begin, end] : fp32_ranges(unit, params.dtype())) {
    parallel_for(end - begin, config_.threads, kChunk, [&, b = begin](int64_t i0, int64_t i1) {
      convert(params.flat(b + i0, i1 - i0), param_ws_.flat(b + i0, i1 - i0));
    });
  }
  return param_ws_.data_as<float>();
}

void Gpt::forward(int unit, const Tensor& params) {
  check_unit(unit, "forward");
  MP_ENFORCE_EQ(unit, forwarded_, "Gpt::forward runs units in order");
  const auto u = static_cast<size_t>(unit);
  const UnitParams<float> w{unit_params(unit, params), params.data(), params.dtype()};
  const double loss = unit_forward(ws_->dims, ws_->buffers, unit, layout_[u], w, inputs(), targets());
  ++forwarded_;
  if (forwarded_ == static_cast<int>(layout_.size())) {
    loss_ = loss;
    next_backward_ = forwarded_ - 1;
  }
}

const float* Gpt::logits() const {
  MP_ENFORCE(micro_batch_ >= 0 && forwarded_ == static_cast<int>(layout_.size()),
             "Gpt::logits before the forward of every unit");
  return ws_->buffers.logits;
}

void Gpt::keep_logits_row(int64_t row) {
  MP_ENFORCE(row >= -1 && row < config_.micro_batch_size * config_.context, "logits row ", row, " of ",
             config_.micro_batch_size * config_.context);
  kept_row_ = row;
}

std::vector<float> Gpt::kept_logits() const {
  MP_ENFORCE(kept_row_ >= 0, "Gpt::kept_logits without keep_logits_row");
  const int64_t padded = gpt_padded_vocab(config_.vocab);
  const float* row = logits() + kept_row_ * padded;
  return std::vector<float>(row, row + padded);
}

double Gpt::loss() const {
  MP_ENFORCE(micro_batch_ >= 0 && forwarded_ == static_cast<int>(layout_.size()),
             "Gpt::loss before the forward of every unit");
  return loss_;
}

void Gpt::backward(int unit, const Tensor& params, const Tensor& grads) {
  check_unit(unit, "backward");
  MP_ENFORCE(next_backward_ >= 0, "Gpt::backward before the forward of every unit (or after unit 0)");
  MP_ENFORCE_EQ(unit, next_backward_, "Gpt::backward runs units in reverse order, once each");
  const UnitLayout& layout = layout_[static_cast<size_t>(unit)];
  MP_ENFORCE(grads.device().is_cpu() && grads.dtype() == DType::kF32 && grads.shape().size() == 1 &&
                 grads.numel() >= layout.numel,
             "gradients of unit ", layout.name, " (fp32, ", layout.numel, " elements): got ", grads.describe());
  // Unit 0's backward reads no parameters (Note [Tied head]).
  const UnitParams<float> w = unit > 0 ? UnitParams<float>{unit_params(unit, params), params.data(), params.dtype()}
                                        : UnitParams<float>{};
  unit_backward(ws_->dims, ws_->buffers, unit, layout, w, inputs(), grads.data_as<float>());
  --next_backward_;
}

}  // namespace mp

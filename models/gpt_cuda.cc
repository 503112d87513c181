#include "models/gpt_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <utility>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/convert.h"
#include "kernels/op_profile.h"
#include "kernels/cuda/convert_cuda.h"
#include "kernels/cuda/flash_attention_cuda.h"
#include "kernels/cuda/gemm_cublaslt.h"
#include "kernels/cuda/gpt_ops_cuda.h"
#include "models/flat_layout.h"
#include "models/gpt_cuda_state.h"

namespace mp {
namespace {

using namespace gpt_cuda;  // NOLINT: the model's own internals (models/gpt_cuda_state.h)
using State = detail::GptCudaState;

int64_t offset(const UnitLayout& unit, int param) { return unit.params[static_cast<size_t>(param)].offset; }

// A unit's parameters as fp32 (the engine's, or widened into param_ws) and
// the engine's buffer itself (bf16 GEMM weights are read from it as they are).
struct UnitParams {
  const float* p = nullptr;
  const void* raw = nullptr;
  DType raw_dtype = DType::kF32;
};

UnitParams unit_params(State& st, int unit, const Tensor& params, cudaStream_t stream) {
  const UnitLayout& layout = st.layout[static_cast<size_t>(unit)];
  MP_ENFORCE(params.device() == st.device && params.shape().size() == 1 && params.numel() >= layout.numel,
             "parameters of unit ", layout.name, " (", layout.numel, " elements on ", st.device,
             "): got ", params.describe());
  if (params.dtype() == DType::kF32) return UnitParams{params.data_as<float>(), params.data(), DType::kF32};
  MP_ENFORCE(params.dtype() == DType::kBF16 || params.dtype() == DType::kF16, "parameters of unit ", layout.name,
             " in ", dtype_name(params.dtype()));
  // Every parameter read as fp32 is widened; a block's bf16 GEMM weights
  // are read as they are (bf16_weight), so they are not (their range of
  // param_ws stays stale and nothing reads it).
  const bool block = unit >= 1 && unit <= st.d.layers;
  const size_t op0 = block ? static_cast<size_t>(unit - 1) * kBlockOps : 0;
  auto read_raw = [&](size_t k) {
    if (!block || params.dtype() != DType::kBF16) return false;
    for (const auto& [param, op] : {std::pair{kAttnW, kCAttn}, {kAttnProjW, kAttnCProj}, {kFcW, kCFc},
                                    {kFcProjW, kMlpCProj}}) {
      if (k == static_cast<size_t>(param)) return st.op_dtype[op0 + static_cast<size_t>(op)] == DType::kBF16;
    }
    return false;
  };
  // One launch per run of neighbouring parameters read as fp32 (a block:
  // five small runs between its four GEMM weights).
  const size_t elem = dtype_size(params.dtype());
  auto widen = [&](int64_t begin, int64_t end) {
    if (end <= begin) return;
    convert_cuda(static_cast<const char*>(params.data()) + static_cast<size_t>(begin) * elem, params.dtype(),
                 st.b.param_ws + begin, DType::kF32, end - begin, ConvertOptions{}, stream);
  };
  int64_t run_begin = 0;
  for (size_t k = 0; k < layout.params.size(); ++k) {
    if (!read_raw(k)) continue;
    const ParamPlacement& p = layout.params[k];
    widen(run_begin, p.offset);
    run_begin = p.offset + p.numel;
  }
  widen(run_begin, layout.numel);
  st.mark(OpFamily::kCast, "widen parameters", unit, stream);
  return UnitParams{st.b.param_ws, params.data(), params.dtype()};
}

GemmInput input(const void* data, DType dtype, int64_t ld, bool transposed = false) {
  return GemmInput{data, dtype, ld, transposed};
}

// A bf16 GEMM weight of n elements at offset `off`: the engine's bf16 values
// as they are, else the fp32 ones rounded into w16.
const bf16* bf16_weight(State& st, const UnitParams& w, int64_t off, int64_t n, cudaStream_t stream) {
  if (w.raw_dtype == DType::kBF16) return static_cast<const bf16*>(w.raw) + off;
  gpt_round_to_bf16_cuda(w.p + off, n, DType::kBF16, st.b.w16, stream);
  return st.b.w16;
}

// Whether the MLP's GELU runs in the GEMM epilogues: their aux matrix's row
// stride (4 C) must be a multiple of 8 (kernels/cuda/gemm_cublaslt.h).
bool gelu_in_epilogue(const Dims& d) { return (4 * d.channels) % 8 == 0; }

// The model's GEMM options, with a GELU epilogue over `aux` (ld `ld`) when
// aux is given.
GemmCudaOptions gemm_options(const State& st, GemmEpilogue epilogue, float* aux, int64_t ld) {
  GemmCudaOptions o = st.gemm;
  if (aux != nullptr) {
    o.epilogue = epilogue;
    o.aux = aux;
    o.aux_ld = ld;
  }
  return o;
}

// y = x w + bias for GEMM op `op` of unit `unit` (Note [GPT autocast]);
// with `gelu_pre`, y = gelu(x w + bias) and gelu_pre = x w + bias (the
// GEMM's GELU epilogue).
void matmul_forward(State& st, int unit, size_t op, const UnitParams& w, int64_t w_off, int64_t bias_off,
                    const float* x, int64_t in, int64_t out, float* y, cudaStream_t stream,
                    float* gelu_pre = nullptr) {
  const int64_t rows = st.d.rows;
  GemmProblem pr;
  pr.m = rows;
  pr.n = out;
  pr.k = in;
  pr.bias = w.p + bias_off;
  pr.c = y;
  pr.ldc = out;
  if (st.op_dtype[op] == DType::kBF16) {
    bf16* x16 = st.b.x16[op];
    gpt_round_to_bf16_cuda(x, rows * in, DType::kBF16, x16, stream);
    pr.a = input(x16, DType::kBF16, in);
    pr.b = input(bf16_weight(st, w, w_off, in * out, stream), DType::kBF16, out);
    st.mark(OpFamily::kCast, "bf16 inputs", unit, stream);
  } else {
    pr.a = input(x, DType::kF32, in);
    pr.b = input(w.p + w_off, DType::kF32, out);
  }
  gemm_cuda(pr, stream, gemm_options(st, GemmEpilogue::kGelu, gelu_pre, out));
  st.mark(OpFamily::kGemm, gelu_pre != nullptr ? "matmul + gelu forward" : "matmul forward", unit, stream);
}

// dx = dy w^T, dw = x^T dy, db = column sums of dy for op `op`; with
// `gelu_pre` (the input was gelu(gelu_pre)), dx is taken on through the
// GELU: dx = (dy w^T) gelu'(gelu_pre), the GEMM's DGELU epilogue.
void matmul_backward(State& st, int unit, size_t op, const UnitParams& w, int64_t w_off, const float* x,
                     const float* dy, int64_t in, int64_t out, float* dx, float* dw, float* db, cudaStream_t stream,
                     float* gelu_pre = nullptr) {
  const int64_t rows = st.d.rows;
  GemmInput x_in, w_in, dy_in;
  if (st.op_dtype[op] == DType::kBF16) {
    gpt_round_to_bf16_cuda(dy, rows * out, DType::kBF16, st.b.dy16, stream);
    x_in = input(st.b.x16[op], DType::kBF16, in);  // the forward's rounding of x
    w_in = input(bf16_weight(st, w, w_off, in * out, stream), DType::kBF16, out);
    dy_in = input(st.b.dy16, DType::kBF16, out);
    st.mark(OpFamily::kCast, "bf16 inputs", unit, stream);
  } else {
    x_in = input(x, DType::kF32, in);
    w_in = input(w.p + w_off, DType::kF32, out);
    dy_in = input(dy, DType::kF32, out);
  }
  GemmProblem dx_pr;  // [rows, in] = dy [rows, out] w^T
  dx_pr.m = rows;
  dx_pr.n = in;
  dx_pr.k = out;
  dx_pr.a = dy_in;
  dx_pr.b = w_in;
  dx_pr.b.transposed = true;
  dx_pr.c = dx;
  dx_pr.ldc = in;
  gemm_cuda(dx_pr, stream, gemm_options(st, GemmEpilogue::kDGelu, gelu_pre, in));
  GemmProblem dw_pr;  // [in, out] = x^T [in, rows] dy [rows, out]
  dw_pr.m = in;
  dw_pr.n = out;
  dw_pr.k = rows;
  dw_pr.a = x_in;
  dw_pr.a.transposed = true;
  dw_pr.b = dy_in;
  dw_pr.c = dw;
  dw_pr.ldc = out;
  gemm_cuda(dw_pr, stream, st.gemm);
  st.mark(OpFamily::kGemm, "matmul backward", unit, stream);
  gpt_bias_backward_cuda(dy, rows, out, db, st.b.bias_ws, stream);
  st.mark(OpFamily::kElementwise, "bias gradient", unit, stream);
}

void embed_forward(State& st, const UnitParams& w, cudaStream_t stream) {
  const Dims& d = st.d;
  const UnitLayout& unit = st.layout[0];
  const int64_t n = d.padded_vocab * d.channels;
  const bool bf16_head = st.op_dtype.back() == DType::kBF16;
  // Note [Tied head]: the head's GEMM input form of wte.
  if (bf16_head && w.raw_dtype == DType::kBF16) {
    MP_CHECK_CUDA(cudaMemcpyAsync(st.b.wte_head, static_cast<const bf16*>(w.raw) + offset(unit, kWte),
                                  static_cast<size_t>(n) * sizeof(bf16), cudaMemcpyDeviceToDevice, stream));
  } else if (bf16_head) {
    gpt_round_to_bf16_cuda(w.p + offset(unit, kWte), n, DType::kBF16, st.b.wte_head, stream);
  } else {
    MP_CHECK_CUDA(cudaMemcpyAsync(st.b.wte_head, w.p + offset(unit, kWte), static_cast<size_t>(n) * sizeof(float),
                                  cudaMemcpyDeviceToDevice, stream));
  }
  st.mark(OpFamily::kCast, "head's copy of wte", 0, stream);
  gpt_embedding_forward_cuda(st.b.tokens, w.p + offset(unit, kWte), w.p + offset(unit, kWpe), d.batch, d.seq,
                             d.channels, d.vocab, st.b.residual[0], stream);
  st.mark(OpFamily::kEmbedding, "embedding forward", 0, stream);
}

void block_forward(State& st, int u, const UnitParams& w, cudaStream_t stream) {
  const Dims& d = st.d;
  const UnitLayout& unit = st.layout[static_cast<size_t>(u)];
  const auto l = static_cast<size_t>(u - 1);
  const size_t op = l * kBlockOps;
  const Layer& y = st.b.layers[l];
  const int64_t rows = d.rows, c = d.channels;
  const float* x = st.b.residual[l];
  float* out = st.b.residual[l + 1];
  auto at = [&](int param) { return w.p + offset(unit, param); };
  auto off = [&](int param) { return offset(unit, param); };
  gpt_layernorm_forward_cuda(x, at(kLn1W), at(kLn1B), rows, c, y.ln1, y.ln1_mean, y.ln1_rstd, stream);
  st.mark(OpFamily::kLayerNorm, "ln_1 forward", u, stream);
  matmul_forward(st, u, op + kCAttn, w, off(kAttnW), off(kAttnB), y.ln1, c, 3 * c, y.qkv, stream);
  if (d.tc_attention) {
    flash_attention_tc_forward_cuda(y.qkv, d.batch, d.seq, c, d.heads, y.atty, y.lse, stream);
  } else {
    flash_attention_forward_cuda(y.qkv, d.batch, d.seq, c, d.heads, y.atty, y.lse, stream);
  }
  st.mark(OpFamily::kAttention, "attention forward", u, stream);
  matmul_forward(st, u, op + kAttnCProj, w, off(kAttnProjW), off(kAttnProjB), y.atty, c, c, y.res2, stream);
  // res2 := x + the attention branch, and ln_2 of it, in one pass.
  gpt_add_layernorm_forward_cuda(x, y.res2, at(kLn2W), at(kLn2B), rows, c, y.res2, y.ln2, y.ln2_mean, y.ln2_rstd,
                                 stream);
  st.mark(OpFamily::kLayerNorm, "residual add + ln_2 forward", u, stream);
  // fch_gelu = gelu(ln_2 c_fc + bias), fch the pre-activation: one GEMM
  // where the epilogue takes the row stride (a multiple of 8).
  if (gelu_in_epilogue(d)) {
    matmul_forward(st, u, op + kCFc, w, off(kFcW), off(kFcB), y.ln2, c, 4 * c, y.fch_gelu, stream, y.fch);
  } else {
    matmul_forward(st, u, op + kCFc, w, off(kFcW), off(kFcB), y.ln2, c, 4 * c, y.fch, stream);
    gpt_gelu_forward_cuda(y.fch, rows * 4 * c, y.fch_gelu, stream);
    st.mark(OpFamily::kGelu, "gelu forward", u, stream);
  }
  matmul_forward(st, u, op + kMlpCProj, w, off(kFcProjW), off(kFcProjB), y.fch_gelu, 4 * c, c, out, stream);
  gpt_add_cuda(y.res2, out, rows * c, out, stream);
  st.mark(OpFamily::kElementwise, "residual add", u, stream);
}

// Note [GPT on CUDA]: the loss and the head's backward GEMMs, chunk by chunk.
void head_forward(State& st, int u, const UnitParams& w, int64_t kept_row, cudaStream_t stream) {
  const Dims& d = st.d;
  const UnitLayout& unit = st.layout[static_cast<size_t>(u)];
  const int64_t rows = d.rows, c = d.channels, vp = d.padded_vocab;
  Buffers& b = st.b;
  gpt_layernorm_forward_cuda(b.residual.back(), w.p + offset(unit, kLnfW), w.p + offset(unit, kLnfB), rows, c, b.lnf,
                             b.lnf_mean, b.lnf_rstd, stream);
  st.mark(OpFamily::kLayerNorm, "ln_f forward", u, stream);
  const bool bf16_head = st.op_dtype.back() == DType::kBF16;
  const DType head_dtype = bf16_head ? DType::kBF16 : DType::kF32;
  const void* x = b.lnf;
  if (bf16_head) {
    gpt_round_to_bf16_cuda(b.lnf, rows * c, DType::kBF16, b.x16.back(), stream);
    x = b.x16.back();
    st.mark(OpFamily::kCast, "bf16 inputs", u, stream);
  }
  const size_t elem = bf16_head ? sizeof(bf16) : sizeof(float);
  const int32_t* targets = b.tokens + rows;
  for (int64_t r0 = 0; r0 < rows; r0 += d.chunk) {
    const int64_t n = std::min(d.chunk, rows - r0);
    const void* x_chunk = static_cast<const char*>(x) + static_cast<size_t>(r0 * c) * elem;
    GemmProblem logits;  // [n, Vp] = x [n, C] wte^T
    logits.m = n;
    logits.n = vp;
    logits.k = c;
    logits.a = input(x_chunk, head_dtype, c);
    logits.b = input(b.wte_head, head_dtype, c, /*transposed=*/true);
    logits.c = b.logits;
    logits.ldc = vp;
    gemm_cuda(logits, stream, st.gemm);
    st.mark(OpFamily::kGemm, "logits", u, stream);
    if (kept_row >= r0 && kept_row < r0 + n) {
      MP_CHECK_CUDA(cudaMemcpyAsync(b.kept, b.logits + (kept_row - r0) * vp, static_cast<size_t>(vp) * sizeof(float),
                                    cudaMemcpyDeviceToDevice, stream));
    }
    gpt_softmax_xent_rows_cuda(b.logits, targets + r0, n, d.vocab, vp, rows, b.row_loss + r0, b.logits, stream);
    st.mark(OpFamily::kSoftmaxXent, "softmax cross-entropy", u, stream);
    const void* dlogits = b.logits;
    if (bf16_head) {
      gpt_round_to_bf16_cuda(b.logits, n * vp, DType::kBF16, b.dlogits16, stream);
      dlogits = b.dlogits16;
      st.mark(OpFamily::kCast, "bf16 d logits", u, stream);
    }
    GemmProblem dx;  // d lnf [n, C] = d logits [n, Vp] wte [Vp, C]
    dx.m = n;
    dx.n = c;
    dx.k = vp;
    dx.a = input(dlogits, head_dtype, vp);
    dx.b = input(b.wte_head, head_dtype, c);
    dx.c = b.dlnf + r0 * c;
    dx.ldc = c;
    gemm_cuda(dx, stream, st.gemm);
    GemmProblem dw;  // d wte [Vp, C] (+)= d logits^T [Vp, n] x [n, C]
    dw.m = vp;
    dw.n = c;
    dw.k = n;
    dw.a = input(dlogits, head_dtype, vp, /*transposed=*/true);
    dw.b = input(x_chunk, head_dtype, c);
    dw.c = b.dwte_head;
    dw.ldc = c;
    dw.accumulate = r0 > 0;
    gemm_cuda(dw, stream, st.gemm);
    st.mark(OpFamily::kGemm, "head backward", u, stream);
  }
  gpt_mean_loss_cuda(b.row_loss, rows, b.mean_loss, stream);
  MP_CHECK_CUDA(cudaMemcpyAsync(st.host_loss(), b.mean_loss, sizeof(double), cudaMemcpyDeviceToHost, stream));
  if (kept_row >= 0) {
    MP_CHECK_CUDA(cudaMemcpyAsync(st.host_kept(), b.kept, static_cast<size_t>(vp) * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream));
  }
  st.mark(OpFamily::kSoftmaxXent, "mean loss", u, stream);
}

void embed_backward(State& st, float* g, cudaStream_t stream) {
  const Dims& d = st.d;
  const UnitLayout& unit = st.layout[0];
  float* dwte = g + offset(unit, kWte);
  float* dwpe = g + offset(unit, kWpe);
  // Note [Tied head]: the head's d wte, then the embedding's added in.
  MP_CHECK_CUDA(cudaMemcpyAsync(dwte, st.b.dwte_head, static_cast<size_t>(d.padded_vocab * d.channels) * sizeof(float),
                                cudaMemcpyDeviceToDevice, stream));
  MP_CHECK_CUDA(cudaMemsetAsync(dwpe, 0, static_cast<size_t>(d.seq * d.channels) * sizeof(float), stream));
  gpt_embedding_backward_cuda(st.b.tokens, st.b.dres, d.batch, d.seq, d.channels, d.vocab, dwte, dwpe, st.b.emb_ws,
                              st.b.emb_ws_bytes, stream);
  st.mark(OpFamily::kEmbedding, "embedding backward", 0, stream);
}

void block_backward(State& st, int u, const UnitParams& w, float* g, cudaStream_t stream) {
  const Dims& d = st.d;
  const UnitLayout& unit = st.layout[static_cast<size_t>(u)];
  const auto l = static_cast<size_t>(u - 1);
  const size_t op = l * kBlockOps;
  const Layer& y = st.b.layers[l];
  Buffers& b = st.b;
  const int64_t rows = d.rows, c = d.channels;
  auto at = [&](int param) { return w.p + offset(unit, param); };
  auto off = [&](int param) { return offset(unit, param); };
  auto grad = [&](int param) { return g + offset(unit, param); };
  // b.dres holds d loss / d (block output); it becomes d loss / d (block input).
  // d fch = (d out c_proj^T) gelu'(fch): the GELU's backward in the GEMM.
  if (gelu_in_epilogue(d)) {
    matmul_backward(st, u, op + kMlpCProj, w, off(kFcProjW), y.fch_gelu, b.dres, 4 * c, c, b.dfch, grad(kFcProjW),
                    grad(kFcProjB), stream, y.fch);
  } else {
    matmul_backward(st, u, op + kMlpCProj, w, off(kFcProjW), y.fch_gelu, b.dres, 4 * c, c, b.dfch, grad(kFcProjW),
                    grad(kFcProjB), stream);
    gpt_gelu_backward_cuda(y.fch, b.dfch, rows * 4 * c, b.dfch, stream);
    st.mark(OpFamily::kGelu, "gelu backward", u, stream);
  }
  matmul_backward(st, u, op + kCFc, w, off(kFcW), y.ln2, b.dfch, c, 4 * c, b.dln, grad(kFcW), grad(kFcB), stream);
  gpt_layernorm_backward_cuda(b.dln, y.res2, at(kLn2W), y.ln2_mean, y.ln2_rstd, rows, c, b.dres, grad(kLn2W),
                              grad(kLn2B), b.ln_ws, stream);
  st.mark(OpFamily::kLayerNorm, "ln_2 backward", u, stream);
  matmul_backward(st, u, op + kAttnCProj, w, off(kAttnProjW), y.atty, b.dres, c, c, b.datty, grad(kAttnProjW),
                  grad(kAttnProjB), stream);
  if (d.tc_attention) {
    flash_attention_tc_backward_cuda(y.qkv, y.atty, y.lse, b.datty, d.batch, d.seq, c, d.heads, b.att_scratch, b.dqkv,
                                     stream);
  } else {
    flash_attention_backward_cuda(y.qkv, y.atty, y.lse, b.datty, d.batch, d.seq, c, d.heads, b.att_scratch, b.dqkv,
                                  stream);
  }
  st.mark(OpFamily::kAttention, "attention backward", u, stream);
  matmul_backward(st, u, op + kCAttn, w, off(kAttnW), y.ln1, b.dqkv, c, 3 * c, b.dln, grad(kAttnW), grad(kAttnB),
                  stream);
  gpt_layernorm_backward_cuda(b.dln, b.residual[l], at(kLn1W), y.ln1_mean, y.ln1_rstd, rows, c, b.dres, grad(kLn1W),
                              grad(kLn1B), b.ln_ws, stream);
  st.mark(OpFamily::kLayerNorm, "ln_1 backward", u, stream);
}

void head_backward(State& st, int u, const UnitParams& w, float* g, cudaStream_t stream) {
  const Dims& d = st.d;
  const UnitLayout& unit = st.layout[static_cast<size_t>(u)];
  Buffers& b = st.b;
  MP_CHECK_CUDA(cudaMemsetAsync(b.dres, 0, static_cast<size_t>(d.rows * d.channels) * sizeof(float), stream));
  gpt_layernorm_backward_cuda(b.dlnf, b.residual.back(), w.p + offset(unit, kLnfW), b.lnf_mean, b.lnf_rstd, d.rows,
                              d.channels, b.dres, g + offset(unit, kLnfW), g + offset(unit, kLnfB), b.ln_ws, stream);
  st.mark(OpFamily::kLayerNorm, "ln_f backward", u, stream);
}

}  // namespace

// ---- the model ------------------------------------------------------------------

GptCuda::GptCuda(const GptConfig& config, Allocator allocator, std::shared_ptr<const TokenBatchSource> source,
                 GptCudaOptions options)
    : config_(config), options_(options), spec_(Gpt::spec_for(config)) {
  if (!allocator.device().is_cuda()) {
    MP_THROW(ConfigError, "the CUDA GPT computes on a CUDA device, but the engine's allocator is on ",
             allocator.device());
  }
  set_source(source ? std::move(source) : std::make_shared<GptData>(config));
  state_ = std::make_unique<detail::GptCudaState>(config_, options_, spec_, allocator);
}

GptCuda::~GptCuda() = default;

int64_t GptCuda::workspace_bytes(const GptConfig& config, const GptCudaOptions& options) {
  validate(config);
  return gpt_cuda::workspace_bytes(dims_of(config, options), gpt_matmul_op_dtypes(config),
                                   FlatLayout(Gpt::spec_for(config), 1).units());
}

int64_t GptCuda::loss_chunk_rows(const GptConfig& config, const GptCudaOptions& options) {
  validate(config);
  return dims_of(config, options).chunk;
}

bool GptCuda::tensor_core_attention(const GptConfig& config, const GptCudaOptions& options) {
  validate(config);
  return tc_attention_for(config, options);
}

void GptCuda::set_source(std::shared_ptr<const TokenBatchSource> source) {
  MP_ENFORCE(source != nullptr, "GptCuda token source");
  MP_ENFORCE(source->batch() == config_.micro_batch_size && source->context() == config_.context,
             "token source ", source->describe(), " gives batch ", source->batch(), " x context ", source->context(),
             "; the model takes ", config_.micro_batch_size, " x ", config_.context);
  source_ = std::move(source);
}

void GptCuda::flush_profile() { state_->flush_profile(); }

void GptCuda::keep_logits_row(int64_t row) {
  MP_ENFORCE(row >= -1 && row < config_.micro_batch_size * config_.context, "logits row ", row, " of ",
             config_.micro_batch_size * config_.context);
  kept_row_ = row;
}

std::vector<float> GptCuda::kept_logits() const {
  MP_ENFORCE(kept_row_ >= 0 && loaded_ && forwarded_ == static_cast<int>(spec_.units.size()),
             "GptCuda::kept_logits without keep_logits_row and a whole forward");
  const float* row = state_->host_kept();
  return std::vector<float>(row, row + state_->d.padded_vocab);
}

void GptCuda::check_unit(int unit, const char* what) const {
  MP_ENFORCE(loaded_, "GptCuda::", what, " before begin_micro_batch_on");
  MP_ENFORCE(unit >= 0 && unit < static_cast<int>(spec_.units.size()), "GptCuda::", what, " of unit ", unit, " of ",
             spec_.units.size());
}

void GptCuda::begin_micro_batch_on(int64_t global_index, Stream& s) {
  State& st = *state_;
  const cudaStream_t stream = cuda_handle(&s);
  if (!st.pending.empty()) st.flush_profile();  // the last micro-batch's marks (profiling only)
  const int slot = st.next_slot;
  st.next_slot = 1 - slot;
  // The copy from this slot two micro-batches ago must have read it.
  MP_CHECK_CUDA(cudaEventSynchronize(st.token_copied[slot]));
  int32_t* host = st.host_token_slot(slot);
  source_->micro_batch(global_index, host, host + st.d.rows);
  MP_CHECK_CUDA(cudaMemcpyAsync(st.b.tokens, host, static_cast<size_t>(2 * st.d.rows) * sizeof(int32_t),
                                cudaMemcpyHostToDevice, stream));
  MP_CHECK_CUDA(cudaEventRecord(st.token_copied[slot], stream));
  loaded_ = true;
  forwarded_ = 0;
  next_backward_ = -1;
}

void GptCuda::forward_on(int unit, const Tensor& params, Stream& s) {
  check_unit(unit, "forward_on");
  MP_ENFORCE_EQ(unit, forwarded_, "GptCuda::forward_on runs units in order");
  State& st = *state_;
  const cudaStream_t stream = cuda_handle(&s);
  st.begin_call(stream);
  const UnitParams w = unit_params(st, unit, params, stream);
  if (unit == 0) {
    embed_forward(st, w, stream);
  } else if (unit <= config_.layers) {
    block_forward(st, unit, w, stream);
  } else {
    head_forward(st, unit, w, kept_row_, stream);
  }
  ++forwarded_;
  if (forwarded_ == static_cast<int>(spec_.units.size())) next_backward_ = forwarded_ - 1;
}

double GptCuda::loss() const {
  MP_ENFORCE(loaded_ && forwarded_ == static_cast<int>(spec_.units.size()),
             "GptCuda::loss before the forward of every unit");
  return *state_->host_loss();  // copied on the stream by the head's forward
}

void GptCuda::backward_on(int unit, const Tensor& params, const Tensor& grads, Stream& s) {
  check_unit(unit, "backward_on");
  MP_ENFORCE(next_backward_ >= 0, "GptCuda::backward_on before the forward of every unit (or after unit 0)");
  MP_ENFORCE_EQ(unit, next_backward_, "GptCuda::backward_on runs units in reverse order, once each");
  State& st = *state_;
  const UnitLayout& layout = st.layout[static_cast<size_t>(unit)];
  MP_ENFORCE(grads.device() == st.device && grads.dtype() == DType::kF32 && grads.shape().size() == 1 &&
                 grads.numel() >= layout.numel,
             "gradients of unit ", layout.name, " (fp32, ", layout.numel, " elements on ", st.device,
             "): got ", grads.describe());
  const cudaStream_t stream = cuda_handle(&s);
  st.begin_call(stream);
  float* g = grads.data_as<float>();
  if (unit == 0) {
    embed_backward(st, g, stream);  // reads no parameters (Note [Tied head])
  } else {
    const UnitParams w = unit_params(st, unit, params, stream);
    if (unit <= config_.layers) {
      block_backward(st, unit, w, g, stream);
    } else {
      head_backward(st, unit, w, g, stream);
    }
  }
  --next_backward_;
}

}  // namespace mp

#include "models/gpt_workspace.h"

#include <algorithm>

#include "kernels/nn/cast.h"
#include "kernels/nn/embedding.h"
#include "kernels/nn/layernorm.h"

namespace mp::gpt {

bool Plan::any_bf16_op() const {
  return std::find(op_dtype.begin(), op_dtype.end(), DType::kBF16) != op_dtype.end();
}

namespace {

// The logits rows the loss holds at once: all of them on the CPU unless
// asked, at most kGptLogitsChunkBytes of stored logits on a GPU.
int64_t chunk_rows(const Plan& p, const GptOptions& o, Device device) {
  if (o.loss_chunk_rows > 0) return std::min(p.rows, o.loss_chunk_rows);
  if (device.is_cpu()) return p.rows;
  const int64_t row_bytes = p.padded_vocab * static_cast<int64_t>(dtype_size(p.head_storage()));
  return std::min(p.rows, std::max<int64_t>(1, kGptLogitsChunkBytes / row_bytes));
}

// Note [GPT activations]: a tensor between two ops holds bf16 values when
// either of them computes in bf16.
BlockDtypes block_dtypes(const Plan& p, int64_t l) {
  const size_t op = static_cast<size_t>(l) * kBlockOps;
  BlockDtypes d;
  d.ln1 = p.op_bf16(op + kCAttn);
  d.qkv = p.op_bf16(op + kCAttn);
  d.atty = d.qkv || p.op_bf16(op + kAttnCProj);
  d.ln2 = p.op_bf16(op + kCFc);
  d.fch = p.op_bf16(op + kCFc) || p.op_bf16(op + kMlpCProj);
  return d;
}

// Hands out 256-byte aligned ranges of one buffer; with a null base it only counts.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <class T>
  T* take(int64_t n) {
    return static_cast<T*>(take_bytes(n * static_cast<int64_t>(sizeof(T))));
  }
  void* take_bytes(int64_t bytes) {
    void* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (bytes + 255) / 256 * 256;
    return p;
  }
  // n activations of bf16 (else fp32) values.
  Act take_act(const Plan& p, int64_t n, bool bf16) {
    const DType dtype = bf16 ? p.bf16_storage : DType::kF32;
    return make_act(take_bytes(n * static_cast<int64_t>(dtype_size(dtype))), bf16, p.bf16_storage);
  }
  int64_t used() const { return used_; }

 private:
  char* base_;
  int64_t used_ = 0;
};

// A block's activations (Layer), stored as `d` says.
Layer take_layer(const Plan& p, const BlockDtypes& d, const nn::Attention& a, Carver& k) {
  const int64_t nc = p.rows * p.channels;
  Layer y{};
  y.ln1 = k.take_act(p, nc, d.ln1);
  y.ln1_mean = k.take<float>(p.rows);
  y.ln1_rstd = k.take<float>(p.rows);
  y.qkv = k.take_act(p, 3 * nc, d.qkv);
  y.atty = k.take_act(p, nc, d.atty);
  y.att_saved = k.take<float>(nn::attention_saved_elements(p.device, a));
  y.res2 = k.take<float>(nc);
  y.ln2 = k.take_act(p, nc, d.ln2);
  y.ln2_mean = k.take<float>(p.rows);
  y.ln2_rstd = k.take<float>(p.rows);
  y.fch = k.take_act(p, 4 * nc, d.fch);
  y.fch_gelu = k.take_act(p, 4 * nc, d.fch);
  return y;
}

// The shared scratch Layer of the recomputed blocks: room for the widest
// of their dtypes (Note [GPT recomputation]); each block reads it as its own.
BlockDtypes widest_recomputed(const Plan& p) {
  BlockDtypes w{true, true, true, true, true};
  for (size_t l = 0; l < p.blocks.size(); ++l) {
    if (!p.recomputed[l]) continue;
    const BlockDtypes& d = p.blocks[l];
    w.ln1 = w.ln1 && d.ln1;
    w.qkv = w.qkv && d.qkv;
    w.atty = w.atty && d.atty;
    w.ln2 = w.ln2 && d.ln2;
    w.fch = w.fch && d.fch;
  }
  return w;
}

// Block l's view of the shared scratch Layer: its buffers, its dtypes.
Layer as_block(const Plan& p, const Layer& scratch, const BlockDtypes& d) {
  Layer y = scratch;
  for (auto [act, bf16] : {std::pair{&y.ln1, d.ln1}, {&y.qkv, d.qkv}, {&y.atty, d.atty}, {&y.ln2, d.ln2},
                           {&y.fch, d.fch}, {&y.fch_gelu, d.fch}}) {
    *act = p.act(act->data, bf16);
  }
  return y;
}

// Bytes of n values held as bf16 where every block's are (else fp32).
int64_t scratch_bytes(const Plan& p, int64_t n, bool (*bf16)(const BlockDtypes&)) {
  bool all = true;
  for (const BlockDtypes& d : p.blocks) all = all && bf16(d);
  return n * static_cast<int64_t>(all ? dtype_size(p.bf16_storage) : sizeof(float));
}

}  // namespace

Plan plan_for(const GptConfig& c, const GptOptions& o, Device device) {
  validate(c);
  Plan p;
  p.device = device;
  p.batch = c.micro_batch_size;
  p.seq = c.context;
  p.channels = c.channels;
  p.heads = c.heads;
  p.layers = c.layers;
  p.vocab = c.vocab;
  p.padded_vocab = gpt_padded_vocab(c.vocab);
  p.rows = p.batch * p.seq;
  p.threads = c.threads;
  p.op_dtype = gpt_matmul_op_dtypes(c);
  p.bf16_storage = nn::bf16_storage(device);
  p.chunk = chunk_rows(p, o, device);
  p.keep_logits = o.keep_logits;
  for (int64_t l = 0; l < p.layers; ++l) {
    p.blocks.push_back(block_dtypes(p, l));
    const bool bf16 = p.blocks.back().qkv;
    // One decision per dtype: blocks of the same dtype share it.
    if (l > 0 && p.blocks[static_cast<size_t>(l - 1)].qkv == bf16) {
      p.attention.push_back(p.attention.back());
    } else {
      p.attention.push_back(nn::attention_plan(device, o.attention, p.batch, p.seq, p.channels, p.heads, bf16));
    }
  }
  const ModelSpec spec = Gpt::spec_for(c);
  const FlatLayout layout(spec, 1);
  for (const UnitLayout& unit : layout.units()) p.max_unit_numel = std::max(p.max_unit_numel, unit.numel);
  const std::vector<bool> units = recomputed_units(spec, o.recompute_every);
  p.recomputed.assign(units.begin() + 1, units.begin() + 1 + p.layers);  // the blocks are units 1 .. layers
  return p;
}

Buffers carve(const Plan& p, char* base, int64_t* bytes) {
  Carver k(base);
  const int64_t nc = p.rows * p.channels, vc = p.padded_vocab * p.channels;
  Buffers b;
  b.tokens = k.take<int32_t>(2 * p.rows);
  b.residual.push_back(k.take<float>(nc));
  const bool any_recomputed = std::find(p.recomputed.begin(), p.recomputed.end(), true) != p.recomputed.end();
  const nn::Attention* saved_widest = nullptr;  // the attention whose saved state is largest: any (same sizes)
  if (!p.attention.empty()) saved_widest = &p.attention.front();
  // Note [GPT recomputation]: one scratch Layer, room for the widest dtypes.
  const Layer scratch = any_recomputed ? take_layer(p, widest_recomputed(p), *saved_widest, k) : Layer{};
  for (int64_t l = 0; l < p.layers; ++l) {
    const auto i = static_cast<size_t>(l);
    b.layers.push_back(p.recomputed[i] ? as_block(p, scratch, p.blocks[i]) : take_layer(p, p.blocks[i], p.attention[i], k));
    b.residual.push_back(k.take<float>(nc));
  }
  b.lnf = k.take_act(p, nc, p.bf16_head());
  b.lnf_mean = k.take<float>(p.rows);
  b.lnf_rstd = k.take<float>(p.rows);
  b.row_loss = k.take<float>(p.rows);
  b.mean_loss = k.take<double>(1);
  b.wte_head = k.take_bytes(vc * static_cast<int64_t>(dtype_size(p.head_storage())));
  if (p.chunked()) b.dwte_head = k.take<float>(vc);  // Note [GPT loss]
  b.logits = k.take_act(p, p.chunk * p.padded_vocab, p.bf16_head());
  b.dlnf = k.take_act(p, nc, p.bf16_head());
  if (p.keep_logits) b.kept_all = k.take<float>(p.rows * p.padded_vocab);
  b.dres = k.take<float>(nc);
  if (p.any_bf16_op()) b.dres16 = k.take_bytes(nc * static_cast<int64_t>(dtype_size(p.bf16_storage)));
  b.dln = k.take_bytes(scratch_bytes(p, nc, [](const BlockDtypes& d) { return d.ln1 && d.ln2; }));
  b.datty = k.take_bytes(scratch_bytes(p, nc, [](const BlockDtypes& d) { return d.atty; }));
  b.dqkv = k.take_bytes(scratch_bytes(p, 3 * nc, [](const BlockDtypes& d) { return d.qkv; }));
  b.dfch = k.take_bytes(scratch_bytes(p, 4 * nc, [](const BlockDtypes& d) { return d.fch; }));
  int64_t att_ws = 0;
  for (const nn::Attention& a : p.attention) att_ws = std::max(att_ws, nn::attention_scratch_bytes(p.device, a));
  b.att_ws = k.take_bytes(att_ws);
  if (p.any_bf16_op()) b.w16 = k.take_bytes(4 * p.channels * p.channels * static_cast<int64_t>(dtype_size(p.bf16_storage)));
  b.param_ws = k.take<float>(p.max_unit_numel);
  b.kept = k.take<float>(p.padded_vocab);
  b.ln_ws = k.take_bytes(nn::layernorm_workspace_bytes(p.device, p.rows, p.channels));
  b.emb_ws_bytes = nn::embedding_backward_workspace_bytes(p.device, p.rows, p.vocab);
  b.emb_ws = k.take_bytes(b.emb_ws_bytes);
  *bytes = k.used();
  return b;
}

}  // namespace mp::gpt

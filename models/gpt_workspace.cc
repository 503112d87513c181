#include "models/gpt_workspace.h"

#include <algorithm>

#include "kernels/nn/cast.h"
#include "kernels/nn/embedding.h"
#include "kernels/nn/gemm.h"
#include "kernels/nn/layernorm.h"

namespace mp::gpt {

bool Plan::any_bf16_op() const {
  return std::find(op_dtype.begin(), op_dtype.end(), DType::kBF16) != op_dtype.end();
}

namespace {

// The logits rows the loss holds at once: all of them on the CPU unless
// asked, at most kGptLogitsChunkBytes of fp32 logits on a GPU.
int64_t chunk_rows(const Plan& p, const GptOptions& o, Device device) {
  if (o.loss_chunk_rows > 0) return std::min(p.rows, o.loss_chunk_rows);
  if (device.is_cpu()) return p.rows;
  return std::min(p.rows, std::max<int64_t>(1, kGptLogitsChunkBytes / (p.padded_vocab * 4)));
}

// Hands out 256-byte aligned ranges of one buffer; with a null base it only counts.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <class T>
  T* take(int64_t n) {
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += (n * static_cast<int64_t>(sizeof(T)) + 255) / 256 * 256;
    return p;
  }
  // n values of bf16 GEMM input stored as `storage` (2 or 4 bytes each).
  void* take_bf16(int64_t n, DType storage) {
    return storage == DType::kBF16 ? static_cast<void*>(take<bf16>(n)) : static_cast<void*>(take<float>(n));
  }
  int64_t used() const { return used_; }

 private:
  char* base_;
  int64_t used_ = 0;
};

// A block's activations (Layer).
Layer take_layer(const Plan& p, Carver& k) {
  const int64_t nc = p.rows * p.channels;
  Layer y{};
  y.ln1 = k.take<float>(nc);
  y.ln1_mean = k.take<float>(p.rows);
  y.ln1_rstd = k.take<float>(p.rows);
  y.qkv = k.take<float>(3 * nc);
  y.atty = k.take<float>(nc);
  y.att_saved = k.take<float>(nn::attention_saved_elements(p.device, p.attention));
  y.res2 = k.take<float>(nc);
  y.ln2 = k.take<float>(nc);
  y.ln2_mean = k.take<float>(p.rows);
  y.ln2_rstd = k.take<float>(p.rows);
  y.fch = k.take<float>(4 * nc);
  y.fch_gelu = k.take<float>(4 * nc);
  return y;
}

// The bf16 GEMM inputs x16: one per bf16 op, but one per BlockOp shared by
// the recomputed blocks (Note [GPT recomputation]).
void take_x16(const Plan& p, Carver& k, Buffers& b) {
  const int64_t nc = p.rows * p.channels;
  auto elements = [&](size_t i) { return i + 1 < p.op_dtype.size() && i % kBlockOps == kMlpCProj ? 4 * nc : nc; };
  std::vector<void*> shared(kBlockOps, nullptr);
  std::vector<bool> taken(kBlockOps, false);  // (a counting Carver hands out nulls)
  for (size_t i = 0; i < p.op_dtype.size(); ++i) {
    void* x = nullptr;
    if (p.op_dtype[i] == DType::kBF16) {
      const size_t block = i / kBlockOps;
      if (block < p.recomputed.size() && p.recomputed[block]) {
        if (!taken[i % kBlockOps]) shared[i % kBlockOps] = k.take_bf16(elements(i), p.bf16_storage);
        taken[i % kBlockOps] = true;
        x = shared[i % kBlockOps];
      } else {
        x = k.take_bf16(elements(i), p.bf16_storage);
      }
    }
    b.x16.push_back(x);
  }
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
  p.attention = nn::Attention{p.batch, p.seq, p.channels, p.heads,
                              nn::attention_on_tensor_cores(o.attention, c.channels / c.heads, c.matmul_dtype)};
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
  const Layer scratch = any_recomputed ? take_layer(p, k) : Layer{};  // Note [GPT recomputation]
  for (int64_t l = 0; l < p.layers; ++l) {
    b.layers.push_back(p.recomputed[static_cast<size_t>(l)] ? scratch : take_layer(p, k));
    b.residual.push_back(k.take<float>(nc));
  }
  b.lnf = k.take<float>(nc);
  b.lnf_mean = k.take<float>(p.rows);
  b.lnf_rstd = k.take<float>(p.rows);
  b.row_loss = k.take<float>(p.rows);
  b.mean_loss = k.take<double>(1);
  b.wte_head = p.bf16_head() ? k.take_bf16(vc, p.bf16_storage) : k.take<float>(vc);
  if (p.logits_in_place()) b.dwte_head = k.take<float>(vc);  // Note [GPT loss]
  b.logits = k.take<float>(p.chunk * p.padded_vocab);
  b.dlogits = p.logits_in_place() ? b.logits : k.take<float>(p.chunk * p.padded_vocab);
  if (p.bf16_head()) b.dlogits16 = k.take_bf16(p.chunk * p.padded_vocab, p.bf16_storage);
  b.dlnf = k.take<float>(nc);
  b.dres = k.take<float>(nc);
  b.dln = k.take<float>(nc);
  b.datty = k.take<float>(nc);
  b.dqkv = k.take<float>(3 * nc);
  b.dfch = k.take<float>(4 * nc);
  b.att_scratch = k.take<float>(nn::attention_scratch_elements(p.device, p.attention));
  take_x16(p, k, b);
  if (p.any_bf16_op()) {
    b.dy16 = k.take_bf16(4 * nc, p.bf16_storage);
    b.w16 = k.take_bf16(4 * p.channels * p.channels, p.bf16_storage);
  }
  b.param_ws = k.take<float>(p.max_unit_numel);
  b.kept = k.take<float>(p.padded_vocab);
  b.ln_ws = k.take<char>(nn::layernorm_backward_workspace_bytes(p.device, p.rows, p.channels));
  b.linear_ws = k.take<char>(nn::linear_backward_workspace_bytes(p.device, p.rows, 4 * p.channels));
  b.emb_ws_bytes = nn::embedding_backward_workspace_bytes(p.device, p.rows, p.vocab);
  b.emb_ws = k.take<char>(b.emb_ws_bytes);
  *bytes = k.used();
  return b;
}

}  // namespace mp::gpt

// models/gpt.h: GPT-2, one model for every device: the model mp_worker
// trains (on the synthetic language or llm.c token files), that the
// engine's tests train ("sharded training equals single-rank training"),
// and that Hugging Face GPT-2 checkpoints map onto (models/gpt_hf.h).
//
// Architecture (GPT-2, as llm.c): token and position embeddings; `layers`
// pre-LN blocks x = x + attn(ln_1(x)), x = x + mlp(ln_2(x)) with causal
// multi-head self-attention (softmax scaled by 1/sqrt(head_dim)) and a GELU
// (tanh approximation) MLP of width 4 C; a final ln_f; a head tied to wte,
// logits = ln_f(x) wte^T. LayerNorm eps is 1e-5. The loss is the mean
// softmax cross-entropy of next-token targets over all batch * context
// positions.
//
// Units, in forward order (Note [Flat units] in models/flat_layout.h):
//   "embed": "wte" [Vp, C], "wpe" [context, C]
//   "h{i}", i = 0 .. layers-1: "h{i}.ln_1.weight"/"bias" [C],
//       "h{i}.attn.c_attn.weight" [C, 3C], "h{i}.attn.c_attn.bias" [3C],
//       "h{i}.attn.c_proj.weight" [C, C], "h{i}.attn.c_proj.bias" [C],
//       "h{i}.ln_2.weight"/"bias" [C], "h{i}.mlp.c_fc.weight" [C, 4C],
//       "h{i}.mlp.c_fc.bias" [4C], "h{i}.mlp.c_proj.weight" [4C, C],
//       "h{i}.mlp.c_proj.bias" [C]
//   "head": "ln_f.weight" [C], "ln_f.bias" [C]
// Weights are in the Hugging Face Conv1D layout [in, out]. Init: wte, wpe and
// the weights normal(0.02), the two c_proj weights normal(0.02 / sqrt(2
// layers)) (GPT-2's residual scaling), LayerNorm weights ones, biases zeros.
// Vp is the vocabulary padded to a multiple of 128 (llm.c): logits of the
// padded ids are computed but the softmax and the loss cover only the first
// `vocab` ids, so the padded rows of wte get zero gradient.
//
// Note [Tied head]
// The head (the last unit) needs wte, which lives in unit 0, and the engine
// may have released unit 0's gathered buffer by then (FULL_SHARD over
// several ranks). So:
//   forward(0)      reads wte where the engine keeps it, when the engine
//                   keeps every unit's parameters until the step's updates
//                   (Model::set_params_persist) and they are the head's
//                   GEMM input as they are (bf16 parameters for a bf16
//                   head, fp32 for an fp32 one); else it copies wte, as the
//                   head's GEMM input (fp32, or its bf16 values for a bf16
//                   head: Note [GPT autocast]), into the model's workspace;
//   forward(last)   computes the logits from that wte, the loss, and the
//                   head's backward products (Note [GPT loss]): d loss /
//                   d (final LayerNorm output), and with the loss in
//                   chunks the head's d wte, into workspace buffers;
//   backward(last)  takes the final LayerNorm's backward from there;
//   backward(0)     writes d wte = (the head's contribution, from that
//                   buffer or, with one chunk, from the d logits left in
//                   the logits buffer and the final LayerNorm output) +
//                   (the embedding's, added row by row in position order)
//                   straight into unit 0's grads.
// backward(0) reads no parameters, and the spec says so
// (UnitSpec::backward_reads_params): the engine gathers nothing for it.
// The wte copy, the kept d logits and the head's d wte buffer are
// activation memory, allocated once with the model. So unit 0's grads carry the whole tied gradient and no
// other unit's do.
//
// Note [GPT data]
// A first-order Markov chain over the vocabulary, a pure function of
// (data_seed, sequence index): every token v has kGptSuccessors likely
// successors drawn once from philox stream kGptTransitionStream; sequence s
// draws its words from philox_u32(data_seed, s, j): token 0 is uniform, and
// token j >= 1 is, with probability 1/8, uniform (noise), else one of the
// previous token's successors, equally likely. Micro-batch g holds sequences
// s = g * micro_batch_size + b; a sequence's context + 1 tokens give the
// inputs tokens[0 .. context) and the targets tokens[1 .. context].
// The best achievable loss is the chain's conditional entropy: for vocab 64
// about 2.0 nats, against ln 64 = 4.16 for a model that learned nothing.
// GptData::entropy_floor() computes it exactly (the mean over the context
// positions of the expected entropy of the next token given the previous
// one), so a training log can show how far the loss is from the best
// possible. This is the embedded default data of mp_worker.
//
// Note [GPT autocast]
// The model's GEMM ops are named "h{i}.attn.c_attn", "h{i}.attn.c_proj",
// "h{i}.mlp.c_fc", "h{i}.mlp.c_proj" (block i) and "head" (the tied logits
// GEMM). matmul_dtype bf16 runs each of them as torch.autocast(dtype=bf16)
// runs nn.Linear: its activation input and its weight are bf16 values, the
// products accumulated in fp32, the bias added in fp32 and the output
// rounded to bf16 (Note [GPT activations]); its backward GEMMs take bf16
// inputs too (dy, x and w), so dx = dy w^T and dw = x^T dy multiply bf16
// values. Unlike autocast, the weight gradients dw and the bias gradients
// (fp32 column sums of the bf16 dy) stay fp32, never rounded to bf16.
// LayerNorm, the softmax of attention and the cross-entropy compute in
// fp32 on bf16 (or fp32) inputs, as autocast's fp32 ops do. An op whose
// whole name matches one of fp32_ops (ECMAScript regexes; e.g. "head",
// "h0\..*", ".*") keeps fp32 inputs; with every op matched the model is bit
// for bit the matmul_dtype fp32 model. bf16 parameters from the engine
// (param_dtype bf16) are the GEMM weights as they are, never widened and
// rounded again; the same values given as fp32 give the same bits. The
// tests' double reference (tests/model_reference.h) ignores matmul_dtype
// and fp32_ops: exact math.
//
// Note [GPT activations]
// Which tensors hold bf16 values, on every device alike (so the CPU tests
// check the GPU's semantics):
// - the residual stream (the embeddings, x + attention, each block's
//   output) is fp32, as in PyTorch's autocast (an fp32 x plus a bf16
//   branch is fp32): the residual adds run in the c_proj GEMMs' epilogue
//   (C = addend + product + bias, in fp32);
// - a tensor between two ops holds bf16 values when either of them
//   computes in bf16: a bf16 GEMM writes bf16 (qkv, the MLP's pre-
//   activation and its GELU, the logits, and every input gradient); an
//   fp32 op whose output a bf16 GEMM reads writes it rounded (ln_1, ln_2,
//   ln_f, attention's output); attention runs in bf16 when c_attn does;
// - each activation's gradient is stored as the activation, but for the
//   residual stream's (fp32), whose bf16 copy for the next bf16 GEMM the
//   LayerNorm backward writes in the same pass;
// - weight and bias gradients, LayerNorm's mean and rstd and attention's
//   statistics are fp32.
// On the CPU bf16 values are stored as bf16, or as their exact fp32 where
// oneDNN has no native bf16 GEMM (nn::bf16_storage): the same values.
//
// Note [GPT on every device]
// Gpt is one class for the CPU and CUDA. Its forward, backward, loss and
// data loading are written once (gpt.cc), as ops on the engine's compute
// stream (kernels/nn/: embedding, layernorm, attention, gemm, classifier,
// casts), each with a CPU body (kernels/cpu/: oneDNN GEMMs and their
// epilogue, the loops) and a CUDA body (kernels/cuda/: cuBLASLt GEMMs with
// their epilogue, cuDNN's fused attention, the LayerNorm, classifier and
// cast kernels) next to each other (Note [Op dispatch] in
// kernels/dispatch.h); each op is one kernel or library call on a GPU. The
// device is the allocator's. So every CPU test runs the model with the
// GPU's semantics: the host thread enqueues and runs ahead, the stream
// executes later (Note [Host runs ahead] in models/model.h); state that ops
// read is the stream's (one workspace of device buffers, values captured
// at enqueue); the call-order checks run on the host at enqueue time;
// tokens reach the device through a ring of pinned slots
// (models/input_ring.h); the loss and a kept logits row come back by
// stream-ordered copies into pinned host memory. What differs by device is
// inside the ops: attention keeps its probabilities on the CPU and only the
// row log-sum-exp on a GPU (cuDNN's for bf16 activations where it takes the
// shape, else the fp32 flash kernels; Gpt::describe_kernels says which),
// and the summation orders.
//
// Note [GPT loss]
// The loss never holds more than `chunk` rows of logits
// (GptOptions::loss_chunk_rows; all rows on the CPU, at most
// kGptLogitsChunkBytes of logits on a GPU): the head's forward runs, per
// chunk of rows, the logits GEMM, the fused classifier (the loss, and d
// logits written over the logits in place, in their dtype: no fp32 logits
// or probabilities are stored) and the head's d (ln_f output) GEMM for
// backward(last), and, with several chunks, its share of d wte, accumulated
// over the chunks in an fp32 [Vp, C] buffer that backward(0) copies into
// unit 0's gradients before adding the embedding's (Note [Tied head]). With
// one chunk backward(0) computes the head's d wte from the d logits, still
// there, straight into unit 0's gradients instead: no [Vp, C] buffer, no
// copy. The mean loss is summed in double from the rows' losses (in row
// order on the CPU). With one chunk the bits are those of the whole-batch
// products; with several, d wte is summed chunk by chunk.
//
// Note [GPT recomputation]
// The blocks are recomputable (Note [Activation recomputation] in
// models/model.h); the embedding is not (its output is block 0's input,
// kept anyway) and neither is the head (its backward follows its forward
// at once). A recomputed block keeps only its input, the residual stream
// residual[l], which every block keeps; its ln_1, qkv, attention output and
// saved state, res2, ln_2, fc and GELU outputs and bf16 GEMM inputs go to
// one scratch Layer shared by every recomputed block. recompute_on(1 + l)
// runs block l's forward again into that scratch (rewriting residual[l + 1]
// with the same bits, read by nothing after block l + 1's backward), so
// backward(1 + l) reads exactly what the first forward wrote. With every
// block recomputed the activations drop from about 16 [rows, C] tensors a
// block (plus attention's saved state: the [B, H, T, T] probabilities on
// the CPU) to one.
//
// Determinism: the CPU op math (Note [GPT op math] in kernels/cpu/layer_parts.h) computes every
// element on one thread in a fixed order, and the GEMMs split their work
// into tiles that do not depend on the thread count (Note [CPU GEMM
// threads] in kernels/cpu/gemm.h), so the model gives the same bits for any
// thread count and on any process of the same CPU type (oneDNN picks its
// kernels by instruction set, so AVX2 and AVX-512 machines may differ in the
// last bits). The CUDA kernels are deterministic too (no floating-point
// atomics, fixed reduction orders, one cuBLASLt algorithm per shape), with
// other bits than the CPU's within fp32 rounding.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/pinned.h"
#include "core/tensor.h"
#include "kernels/dispatch.h"
#include "kernels/nn/attention.h"
#include "kernels/nn/cast.h"
#include "models/call_order.h"
#include "models/input_ring.h"
#include "models/model.h"
#include "models/stream_model.h"
#include "models/token_data.h"

namespace mp {

struct GptConfig {
  int64_t vocab = 64;            // real vocabulary; the model pads it (gpt_padded_vocab)
  int64_t context = 16;          // sequence length T
  int64_t channels = 32;         // C
  int64_t heads = 4;             // must divide channels
  int64_t layers = 2;
  int64_t micro_batch_size = 2;  // sequences per micro-batch, B
  uint64_t data_seed = 1234;
  int threads = 0;               // CPU threads of the op loops and GEMMs; 0: default_cpu_threads()
  // Note [GPT autocast]: the inputs of the GEMM ops, fp32 or bf16 ...
  DType matmul_dtype = DType::kF32;
  // ... except the ops whose names match one of these (ECMAScript), which keep fp32.
  std::vector<std::string> fp32_ops;
};

// The names of the GEMM ops of a GPT with `layers` blocks, in forward order:
// h0.attn.c_attn, h0.attn.c_proj, h0.mlp.c_fc, h0.mlp.c_proj, h1..., head.
std::vector<std::string> gpt_matmul_op_names(int64_t layers);
// The input dtype of each op of gpt_matmul_op_names(config.layers) under
// Note [GPT autocast]. Validates config.
std::vector<DType> gpt_matmul_op_dtypes(const GptConfig& config);

// Throws ConfigError naming the field, e.g. "gpt.heads = 5 does not divide
// gpt.channels = 32", "gpt.layers = 0: must be positive" or
// "compute.fp32_ops[1] = "h(": not an ECMAScript regex (...)": the size
// rules of check_gpt_sizes(config, "gpt"), then micro_batch_size, threads,
// matmul_dtype and fp32_ops.
void validate(const GptConfig& config);

// The size rules of a GPT, each a ConfigError naming the field as
// PREFIX.NAME (with "model.gpt": "model.gpt.heads = 5 does not divide
// model.gpt.channels = 32"): vocab, context, channels, heads and layers
// positive; vocab at most 2^30 (token ids are int32); context and channels
// at most kMaxModelWidth, layers at most kMaxModelLayers, and at most
// kMaxModelParams parameters (gpt_parameter_count; models/model_limits.h);
// heads divides channels.
void check_gpt_sizes(const GptConfig& config, const std::string& prefix);

inline constexpr int64_t kGptVocabMultiple = 128;
// vocab rounded up to a multiple of kGptVocabMultiple.
int64_t gpt_padded_vocab(int64_t vocab);

// ---- sizes and costs -----------------------------------------------------------

// The parameters: wte vocab x C (without the padding to gpt_padded_vocab),
// wpe context x C, 12 C^2 + 13 C per block, ln_f 2 C. A double, so a config
// check can count absurd sizes; Gpt::spec_for(config).numel() is this plus
// wte's padding rows.
double gpt_parameter_count(const GptConfig& config);

// Training FLOPs per token of the GPT, nanoGPT's (and PaLM's) estimate
// 6 N + 12 L C T: N the parameters without the position embeddings and
// without the vocabulary padding (6 N: the forward and backward GEMMs), and
// 12 L C T the attention scores and their weighted sums (forward and
// backward, the causal half not subtracted).
double gpt_train_flops_per_token(const GptConfig& config);

// The GEMM input dtype (Note [GPT autocast]) of a GPT whose parameters are
// `param_dtype` (the precision policy's): `requested` (compute.matmul_dtype)
// when given, else bf16 when param_dtype is bf16 (autocast's choice), else
// fp32 (the fp32 and tf32 recipes, and amp_fp16, whose fp16 GEMM inputs the
// CPU GEMMs do not take: its GEMMs run on fp32 inputs; parameters, gradients
// and loss scaling stay fp16 as the recipe says). Throws ConfigError when
// fp16 is requested.
DType gpt_matmul_dtype(std::optional<DType> requested, DType param_dtype);

// The run log's line for the model: "GPT-2 of N parameters (layers L,
// channels C, heads H, context T, vocab V); GEMMs on bf16 inputs, K kept
// fp32 (compute.fp32_ops)" (the last part only when some are). Validates
// config.
std::string gpt_describe(const GptConfig& config);

// ---- data (Note [GPT data]) ---------------------------------------------------

inline constexpr uint64_t kGptTransitionStream = uint64_t{1} << 63;
inline constexpr int64_t kGptSuccessors = 4;

class GptData final : public TokenBatchSource {
 public:
  explicit GptData(const GptConfig& config);  // validates config
  // The context + 1 tokens of sequence `index` >= 0.
  void sequence(int64_t index, int32_t* tokens) const;
  int64_t batch() const override { return batch_; }
  int64_t context() const override { return context_; }
  // inputs, targets: micro_batch_size * context tokens each, row-major
  // [batch, context]. global_index >= 0.
  void micro_batch(int64_t global_index, int32_t* inputs, int32_t* targets) const override;
  std::string describe() const override;
  // The best achievable mean loss in nats (Note [GPT data]), exact up to
  // double rounding: the philox words' distributions are counted exactly.
  double entropy_floor() const;

 private:
  void walk(int64_t index, int32_t* inputs, int32_t* targets) const;

  int64_t vocab_ = 0;
  int64_t context_ = 0;
  int64_t batch_ = 0;
  uint64_t seed_ = 0;
  std::vector<int32_t> successors_;  // [vocab, kGptSuccessors]
};

// ---- the model ----------------------------------------------------------------

// Which CUDA attention kernels run (kernels/nn/attention.h).
using GptAttention = nn::AttentionKernel;

struct GptOptions {
  // CUDA: cuDNN's fused attention for bf16 activations where cuDNN takes
  // the shape, else the fp32 flash kernels (kernels/nn/attention.h).
  GptAttention attention = GptAttention::kAuto;
  // Rows of logits the loss holds at once; 0: all of them on the CPU, at
  // most kGptLogitsChunkBytes of logits on a GPU (Note [GPT loss]).
  int64_t loss_chunk_rows = 0;
  bool allow_tf32 = false;     // CUDA: fp32 GEMMs on TF32 tensor cores (the tf32 recipe)
  bool deterministic = false;  // CUDA: GEMM algorithms chosen untimed (engine.deterministic)
  // Note [GPT recomputation]: the blocks whose activations are recomputed,
  // recomputed_units' k (0: none); the engine's
  // engine.activation_checkpointing must say the same (recompute_every in
  // runtime/engine_options.h).
  int recompute_every = 0;
  // Keep every forward's logits (widened to fp32, [rows, Vp]) for
  // Gpt::logits(), at the cost of that buffer and one copy per chunk: for
  // tests and evaluation, never needed to train.
  bool keep_logits = false;
};

// At most this many bytes of logits (as stored: bf16 in the bf16 recipes)
// at once on a GPU: GPT-2 124M's 16 x 1024 rows of bf16 logits are one chunk.
inline constexpr int64_t kGptLogitsChunkBytes = int64_t{2} << 30;

namespace gpt {
struct Plan;     // sizes on a device (models/gpt_workspace.h)
struct Buffers;  // the workspace's buffers
}  // namespace gpt

class Gpt final : public StreamModel {
 public:
  // Computes on the allocator's device (the engine's: CPU or CUDA), where it
  // allocates its one workspace (MemCategory::kActivations) here, so nothing
  // is allocated per micro-batch. Validates config and options. source:
  // the tokens (models/token_data.h); null: GptData(config), the synthetic
  // language.
  explicit Gpt(const GptConfig& config, Allocator allocator = Allocator(),
               std::shared_ptr<const TokenBatchSource> source = nullptr, GptOptions options = {});
  ~Gpt() override;
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  static ModelSpec spec_for(const GptConfig& config);  // validates config
  // The bytes the constructor allocates on `device` (MemCategory::
  // kActivations): the memory plan's activations row. For a CUDA device,
  // that device must be current (the ops ask CUB for scratch sizes).
  static int64_t activation_bytes(const GptConfig& config, Device device = Device::cpu(),
                                  const GptOptions& options = {});
  // The rows of logits the loss computes at once on `device`.
  static int64_t loss_chunk_rows(const GptConfig& config, Device device, const GptOptions& options = {});
  // The kernels that run where a device has a choice, for the run log: on
  // a GPU the attention (cuDNN's or the flash kernels, and why) and the
  // loss's chunks; on the CPU "".
  std::string describe_kernels() const;
  // Whether block l's attention runs on cuDNN (a GPU's choice).
  bool cudnn_attention(int64_t block) const;

  const GptConfig& config() const { return config_; }
  const ModelSpec& spec() const override { return spec_; }
  Device device() const override;

  // ---- Model (models/model.h): enqueued on the engine's compute stream
  void begin_micro_batch_on(int64_t global_index, Stream& s) override;
  void forward_on(int unit, const Tensor& params, Stream& s) override;
  void backward_on(int unit, const Tensor& params, const Tensor& grads, Stream& s) override;
  bool recomputes(int unit) const override;
  void recompute_on(int unit, const Tensor& params, Stream& s) override;

  // Switches the token source (e.g. to validation data and back): later
  // begin_micro_batch_on calls read it. Its batch and context must equal
  // the config's (EnforceError otherwise).
  void set_source(std::shared_ptr<const TokenBatchSource> source);
  // Note [Tied head]: whether the head may read wte in unit 0's parameters.
  void set_params_persist(bool persist) override { params_persist_ = persist; }
  const TokenBatchSource& source() const { return *source_; }
  const std::shared_ptr<const TokenBatchSource>& shared_source() const { return source_; }
  // Keeps logits row `row` (0 .. micro_batch_size * context - 1; -1: none)
  // of every forward enqueued later, for kept_logits(): sampling reads one
  // row per forward, and the model never holds all logits on a GPU.
  void keep_logits_row(int64_t row);
  // The kept row's gpt_padded_vocab(vocab) logits from the last whole
  // forward, on the host; call once the stream has run it (after the
  // engine's evaluate returned). EnforceError without a kept row or forward.
  std::vector<float> kept_logits() const;
  // Puts the GPU op times recorded so far into the op profile (Note [Op
  // dispatch] in kernels/dispatch.h; CPU ops add theirs as they run).
  void flush_profile();

  // ---- Direct calls (models/stream_model.h), and on the CPU what they left:
  // The current micro-batch: micro_batch_size * context each.
  const int32_t* inputs() const;
  const int32_t* targets() const;
  // The logits of the last forward, [micro_batch_size * context rows,
  // gpt_padded_vocab(vocab)] row-major, widened to fp32 (the columns past
  // vocab are padding), valid until the next forward: only with
  // GptOptions::keep_logits (EnforceError otherwise or before a whole forward).
  const float* logits() const;

 private:
  struct UnitParams;
  UnitParams unit_params(const OpContext& cx, int unit, const Tensor& params);
  nn::Ranges fp32_ranges(int unit, DType params) const;
  void enqueue_loss(double* loss, Stream& s) const override;
  // The units' math (Note [GPT on every device]).
  void embed_forward(const OpContext& cx, const UnitParams& w);
  void block_forward(const OpContext& cx, int unit, const UnitParams& w);
  void head_forward(const OpContext& cx, const UnitParams& w);
  void head_chunk(const OpContext& cx, int64_t r0, int64_t n);
  void head_dwte(const OpContext& cx, int64_t r0, int64_t n, float* dwte);
  void embed_backward(const OpContext& cx, float* g);
  void block_backward(const OpContext& cx, int unit, const UnitParams& w, float* g);
  void head_backward(const OpContext& cx, const UnitParams& w, float* g);
  nn::Operand gemm_weight(const OpContext& cx, const UnitParams& w, int param, size_t op);
  // dres for the GEMMs of block op `op`: the fp32 gradient or its bf16 copy.
  nn::Operand residual_grad(size_t op) const;

  GptConfig config_;
  GptOptions options_;
  ModelSpec spec_;
  std::vector<UnitLayout> layout_;  // FlatLayout(spec_, 1)
  std::shared_ptr<const TokenBatchSource> source_;
  std::unique_ptr<gpt::Plan> plan_;
  Buffer workspace_;
  std::unique_ptr<gpt::Buffers> b_;
  InputRing tokens_;  // inputs then targets, rows each
  PinnedBuffer kept_host_;  // the kept logits row, copied back on the stream
  OpTimer timer_;
  CallOrder order_;  // checked on the host at enqueue time (Note [Host runs ahead])
  int64_t kept_row_ = -1;
  bool kept_written_ = false;  // a forward with a kept row was enqueued
  bool kept_all_written_ = false;  // a forward with keep_logits was enqueued
  bool params_persist_ = false;     // Model::set_params_persist
  const void* wte_head_ = nullptr;  // Note [Tied head]: wte as the head reads it, set by forward(0)
};

}  // namespace mp

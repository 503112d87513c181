// models/gpt_workspace.h: the GPT's sizes on a device and the buffers
// carved from its one workspace. Internal to models/gpt.cc (and its
// activation_bytes, the memory plan's row).
//
// The layout is the same on every device but for what the device's ops
// keep (kernels/nn/): attention's saved state (the probabilities on the
// CPU, the row log-sum-exp on a GPU), the ops' scratch (CUDA only), and how
// bf16 GEMM inputs are stored (nn::bf16_storage).
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "kernels/act.h"
#include "kernels/nn/attention.h"
#include "models/flat_layout.h"
#include "models/gpt.h"

namespace mp::gpt {

// A block's GEMM ops, and each unit's parameters in declaration order
// (Gpt::spec_for).
enum BlockOp { kCAttn = 0, kAttnCProj, kCFc, kMlpCProj, kBlockOps };
enum EmbedParam { kWte = 0, kWpe };
enum BlockParam {
  kLn1W = 0, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB
};
enum HeadParam { kLnfW = 0, kLnfB };

// Which of a block's activations hold bf16 values (Note [GPT activations]
// in models/gpt.h); each gradient is stored as its tensor.
struct BlockDtypes {
  bool ln1 = false;   // c_attn's input
  bool qkv = false;   // c_attn's output, attention's input (attention in bf16)
  bool atty = false;  // attention's output, attn.c_proj's input
  bool ln2 = false;   // c_fc's input
  bool fch = false;   // c_fc's output (and its GELU), mlp.c_proj's input
};

// The sizes of one micro-batch on one device, and the choices they imply.
struct Plan {
  Device device;
  int64_t batch = 0, seq = 0, channels = 0, heads = 0, layers = 0, vocab = 0, padded_vocab = 0;
  int64_t rows = 0;   // batch * seq
  int64_t chunk = 0;  // rows of logits the loss holds at once
  int threads = 0;
  // Note [GPT autocast]: GEMM op i's input dtype (block l's ops are
  // 4 l .. 4 l + 3 in BlockOp order, the head last), and how the device
  // stores bf16 values.
  std::vector<DType> op_dtype;
  DType bf16_storage = DType::kBF16;
  std::vector<BlockDtypes> blocks;       // per block
  std::vector<nn::Attention> attention;  // per block
  int64_t max_unit_numel = 0;
  // Note [GPT recomputation]: per block, whether its activations are
  // recomputed (they then live in the shared scratch Layer).
  std::vector<bool> recomputed;
  bool keep_logits = false;  // GptOptions::keep_logits

  bool op_bf16(size_t op) const { return op_dtype[op] == DType::kBF16; }
  bool any_bf16_op() const;
  bool bf16_head() const { return op_dtype.back() == DType::kBF16; }
  // How the head's GEMM inputs and outputs (ln_f's output, wte, the logits
  // and their gradient) are stored.
  DType head_storage() const { return bf16_head() ? bf16_storage : DType::kF32; }
  // An activation of bf16 (else fp32) values at `data`.
  Act act(void* data, bool bf16) const { return make_act(data, bf16, bf16_storage); }
  // The loss runs in chunks: the head's d wte is summed over them in a
  // buffer; with one chunk backward(0) computes it from the kept d logits.
  bool chunked() const { return chunk < rows; }
  // Unit 0 reads wte from the engine's bf16 parameters as they are: bf16
  // parameters, a bf16 head and bf16 stored as bf16, where the head's input
  // form of wte is those bits.
  bool raw_bf16_wte(DType params) const {
    return params == DType::kBF16 && bf16_storage == DType::kBF16 && bf16_head();
  }
};

// Validates config and options; for CUDA the device must be current (the
// ops ask CUB for scratch sizes, and cuDNN whether it takes the attention).
Plan plan_for(const GptConfig& config, const GptOptions& options, Device device);

struct Layer {
  Act ln1;                           // ln_1 output [rows, C]
  float *ln1_mean, *ln1_rstd;        // its mean and rstd [rows]
  Act qkv, atty;                     // c_attn output [rows, 3C], attention output [rows, C]
  float* att_saved;                  // attention's saved state
  float* res2;                       // x + attention branch [rows, C], fp32
  Act ln2;
  float *ln2_mean, *ln2_rstd;
  Act fch, fch_gelu;                 // c_fc output (pre-activation) and its gelu [rows, 4C]
};

// Every buffer of the model, in one workspace of the device.
struct Buffers {
  int32_t* tokens = nullptr;  // inputs then targets, rows each
  std::vector<float*> residual;  // layers + 1: [0] the embeddings, [l + 1] block l's output
  std::vector<Layer> layers;     // a recomputed block's is the one shared scratch Layer
  Act lnf;
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;
  float* row_loss = nullptr;   // [rows]
  double* mean_loss = nullptr;
  // Note [Tied head]: wte [Vp, C] as the head's GEMM input (head_storage),
  // and, with the loss in chunks, the head's share of d wte (fp32; Note
  // [GPT loss]).
  void* wte_head = nullptr;
  float* dwte_head = nullptr;
  Act logits;                  // [chunk, Vp]; overwritten in place by d logits
  Act dlnf;                    // d loss / d (ln_f output) [rows, C]
  float* kept_all = nullptr;   // GptOptions::keep_logits: [rows, Vp], fp32
  // Backward scratch, shared by the blocks: dres is d loss / d residual
  // (fp32) and dres16 its copy for a bf16 GEMM; the others hold a block's
  // gradients as its BlockDtypes say (room for fp32).
  float* dres = nullptr;
  void* dres16 = nullptr;
  void *dln = nullptr, *datty = nullptr, *dqkv = nullptr, *dfch = nullptr;
  void* att_ws = nullptr;      // the attention ops' scratch
  void* w16 = nullptr;         // an fp32 weight rounded for a bf16 GEMM (amp_bf16)
  float* param_ws = nullptr;   // a narrow unit widened to fp32
  float* kept = nullptr;       // a kept logits row [Vp]
  void *ln_ws = nullptr, *emb_ws = nullptr;  // the ops' scratch
  int64_t emb_ws_bytes = 0;
};

// The buffers carved from `base` (null: only count); *bytes := bytes used.
Buffers carve(const Plan& p, char* base, int64_t* bytes);

}  // namespace mp::gpt

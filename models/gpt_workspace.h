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

// The sizes of one micro-batch on one device, and the choices they imply.
struct Plan {
  Device device;
  int64_t batch = 0, seq = 0, channels = 0, heads = 0, layers = 0, vocab = 0, padded_vocab = 0;
  int64_t rows = 0;   // batch * seq
  int64_t chunk = 0;  // rows of logits the loss holds at once
  int threads = 0;
  // Note [GPT autocast]: GEMM op i's input dtype (block l's ops are
  // 4 l .. 4 l + 3 in BlockOp order, the head last), and how the device
  // stores bf16 inputs.
  std::vector<DType> op_dtype;
  DType bf16_storage = DType::kBF16;
  nn::Attention attention;
  int64_t max_unit_numel = 0;
  // Note [GPT recomputation]: per block, whether its activations are
  // recomputed (they then live in the shared scratch Layer).
  std::vector<bool> recomputed;

  bool any_bf16_op() const;
  DType head_dtype() const { return op_dtype.back(); }
  bool bf16_head() const { return head_dtype() == DType::kBF16; }
  // How the head's GEMM inputs (ln_f's output, wte, d logits) are stored.
  DType head_storage() const { return bf16_head() ? bf16_storage : DType::kF32; }
  // d logits overwrites the logits when the loss runs in chunks; with one
  // chunk the whole logits stay readable (Gpt::logits()).
  bool logits_in_place() const { return chunk < rows; }
  // Unit 0 reads wte from the engine's bf16 parameters as they are: bf16
  // parameters, a bf16 head and bf16 stored as bf16, where the head's input
  // form of wte is those bits.
  bool raw_bf16_wte(DType params) const {
    return params == DType::kBF16 && bf16_storage == DType::kBF16 && bf16_head();
  }
};

// Validates config and options; for CUDA the device must be current (the
// ops ask CUB for scratch sizes).
Plan plan_for(const GptConfig& config, const GptOptions& options, Device device);

struct Layer {
  float *ln1, *ln1_mean, *ln1_rstd;  // ln_1 output [rows, C], its mean and rstd [rows]
  float *qkv, *atty, *att_saved;     // c_attn output [rows, 3C], attention output [rows, C], its saved state
  float* res2;                       // x + attention branch [rows, C]
  float *ln2, *ln2_mean, *ln2_rstd;
  float *fch, *fch_gelu;             // c_fc output and its gelu [rows, 4C]
};

// Every buffer of the model, in one workspace of the device.
struct Buffers {
  int32_t* tokens = nullptr;  // inputs then targets, rows each
  std::vector<float*> residual;  // layers + 1: [0] the embeddings, [l + 1] block l's output
  std::vector<Layer> layers;     // a recomputed block's is the one shared scratch Layer
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr;
  float* row_loss = nullptr;   // [rows]
  double* mean_loss = nullptr;
  // Note [Tied head]: wte [Vp, C] as the head's GEMM input (fp32, or bf16
  // values in bf16_storage), and, with the loss in chunks, the head's share
  // of d wte (fp32; Note [GPT loss]).
  void* wte_head = nullptr;
  float* dwte_head = nullptr;
  float* logits = nullptr;     // [chunk, Vp]
  float* dlogits = nullptr;    // [chunk, Vp], or logits itself (in place)
  void* dlogits16 = nullptr;   // [chunk, Vp] bf16 values of a bf16 head's d logits
  float* dlnf = nullptr;       // d loss / d (ln_f output) [rows, C]
  // Backward scratch, shared by the blocks; dres is d loss / d residual.
  float *dres = nullptr, *dln = nullptr, *datty = nullptr, *dqkv = nullptr, *dfch = nullptr, *att_scratch = nullptr;
  // bf16 GEMM inputs (Note [GPT autocast]): x16[i] op i's activation input,
  // rounded by the forward and read again by the backward (null for fp32
  // ops; a recomputed block's share one scratch per BlockOp); dy16 a
  // block's output gradient; w16 a weight.
  std::vector<void*> x16;
  void *dy16 = nullptr, *w16 = nullptr;
  float* param_ws = nullptr;   // a narrow unit widened to fp32
  float* kept = nullptr;       // a kept logits row [Vp]
  void *ln_ws = nullptr, *linear_ws = nullptr, *emb_ws = nullptr;  // the ops' scratch (CUDA)
  int64_t emb_ws_bytes = 0;
};

// The buffers carved from `base` (null: only count); *bytes := bytes used.
Buffers carve(const Plan& p, char* base, int64_t* bytes);

}  // namespace mp::gpt

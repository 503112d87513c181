// models/gpt_cuda_state.h: the CUDA GPT's device memory and bookkeeping,
// internal to models/gpt_cuda.cc (Note [GPT on CUDA] in models/gpt_cuda.h):
// its sizes, the buffers carved from its one workspace, the pinned host
// buffers, and the marks that time ops for the op profile and, with
// MP_CUDA_SYNC, wait after them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "kernels/op_profile.h"
#include "kernels/cuda/gemm_cublaslt.h"
#include "models/flat_layout.h"
#include "models/gpt_cuda.h"

namespace mp::gpt_cuda {

// A block's GEMM ops, and each unit's parameters in declaration order
// (Gpt::spec_for).
enum BlockOp { kCAttn = 0, kAttnCProj, kCFc, kMlpCProj, kBlockOps };
enum EmbedParam { kWte = 0, kWpe };
enum BlockParam {
  kLn1W = 0, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB
};
enum HeadParam { kLnfW = 0, kLnfB };

// The sizes of one micro-batch.
struct Dims {
  int64_t batch = 0, seq = 0, channels = 0, heads = 0, layers = 0, vocab = 0, padded_vocab = 0, rows = 0;
  int64_t chunk = 0;  // rows of logits at a time
  bool tc_attention = false;
};

// Whether attention runs on tensor cores (GptCuda::tensor_core_attention).
bool tc_attention_for(const GptConfig& c, const GptCudaOptions& o);
Dims dims_of(const GptConfig& c, const GptCudaOptions& o);

struct Layer {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu;
};

// Every device buffer of the model (Note [GPT on CUDA]).
struct Buffers {
  int32_t* tokens = nullptr;  // inputs then targets, rows each
  std::vector<float*> residual;
  std::vector<Layer> layers;
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr, *row_loss = nullptr;
  double* mean_loss = nullptr;
  void* wte_head = nullptr;  // [Vp, C]: bf16 for a bf16 head, else fp32
  float* logits = nullptr;   // [chunk, Vp], d logits in place
  bf16* dlogits16 = nullptr;  // [chunk, Vp], a bf16 head's GEMM input
  float *dwte_head = nullptr, *dlnf = nullptr;
  float *dres = nullptr, *dln = nullptr, *datty = nullptr, *dqkv = nullptr, *dfch = nullptr, *att_scratch = nullptr;
  std::vector<bf16*> x16;  // op i's bf16 input (null for fp32 ops)
  bf16 *dy16 = nullptr, *w16 = nullptr;
  float* param_ws = nullptr;  // a unit widened to fp32
  float* kept = nullptr;      // a kept logits row [Vp]
  void* ln_ws = nullptr;
  void* bias_ws = nullptr;
  void* emb_ws = nullptr;
  int64_t emb_ws_bytes = 0;
};

// The buffers carved from `base` (null: only count); *bytes := bytes used.
Buffers carve(const Dims& d, const std::vector<DType>& op_dtype, int64_t max_unit_numel, int64_t emb_ws_bytes,
              char* base, int64_t* bytes);
// The workspace's bytes (carve's count); needs a current device (CUB).
int64_t workspace_bytes(const Dims& d, const std::vector<DType>& op_dtype, const std::vector<UnitLayout>& layout);
int64_t max_unit_numel(const std::vector<UnitLayout>& layout);

// Pinned host memory, freed after the device is done with it.
struct Pinned {
  void* p = nullptr;
  explicit Pinned(size_t bytes);
  ~Pinned();
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
};

}  // namespace mp::gpt_cuda

namespace mp::detail {

struct GptCudaState {
  GptCudaState(const GptConfig& config, const GptCudaOptions& options, const ModelSpec& spec, Allocator& allocator);
  ~GptCudaState();

  int32_t* host_token_slot(int slot) const { return static_cast<int32_t*>(host_tokens.p) + slot * 2 * d.rows; }
  double* host_loss() const { return static_cast<double*>(host_scalars.p); }
  float* host_kept() const { return reinterpret_cast<float*>(static_cast<char*>(host_scalars.p) + sizeof(double)); }

  // The start of a model call: with the op profile on, an event that the
  // call's first mark measures from (the engine's own work between calls
  // is not the model's).
  void begin_call(cudaStream_t st);
  // The end of op `op` of unit `unit`, of family `family`: everything
  // enqueued since the last mark. With the op profile on, an event pair
  // timed later (flush_profile); with sync_each_op (Note [GPT on CUDA]) a
  // device fault throws here, naming the op.
  void mark(OpFamily family, const char* op, int unit, cudaStream_t st);
  // Adds the timed marks to the op profile (kernels/op_profile.h):
  // waits for them, so only while profiling.
  void flush_profile();

  Device device;
  gpt_cuda::Dims d;
  std::vector<DType> op_dtype;
  std::vector<UnitLayout> layout;
  GemmCudaOptions gemm;
  bool sync_each_op;
  Buffer ws;
  gpt_cuda::Buffers b;
  gpt_cuda::Pinned host_tokens;   // two slots of inputs then targets
  gpt_cuda::Pinned host_scalars;  // the loss (double), then a kept logits row
  cudaEvent_t token_copied[2] = {};
  int next_slot = 0;
  // The op profile (mark, flush_profile).
  struct Timed {
    OpFamily family;
    cudaEvent_t start, end;
  };
  bool profiling = false;
  cudaEvent_t previous = nullptr;
  std::vector<Timed> pending;
  std::vector<cudaEvent_t> free_events, used_events;

 private:
  cudaEvent_t take_event();
};

}  // namespace mp::detail

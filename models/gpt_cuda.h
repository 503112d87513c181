// models/gpt_cuda.h: the GPT of models/gpt.h on a CUDA device: the same
// units, parameters, data and math (Note [GPT autocast]: GEMM inputs rounded
// to bf16 where the op is bf16, fp32 accumulation and fp32 outputs), as
// kernels on the engine's compute stream. Only in builds with MP_WITH_CUDA.
//
// Note [GPT on CUDA]
// - GEMMs: cuBLASLt (kernels/cuda/gemm_cublaslt.h), bf16 x bf16 or fp32 x
//   fp32 (TF32 with GptCudaOptions::allow_tf32, the tf32 recipe), the bias
//   in the epilogue; the MLP's GELU too (c_fc's forward writes gelu(y) and
//   keeps y; c_proj's backward applies gelu'(y) to its dx), and the
//   residual add before ln_2 is fused into ln_2's kernel. bf16 parameters from the engine are the GEMM weights as
//   they are; the rest of a bf16 unit (LayerNorm weights, biases, the
//   embeddings) is widened to fp32 once per call.
// - Attention: the flash kernels (kernels/cuda/flash_attention_cuda.h): no
//   T x T matrix; the forward keeps the output and the row log-sum-exp.
//   With bf16 GEMMs (matmul_dtype bf16) and head size 64 or 128 the
//   tensor-core variant (bf16 q, k, v and probabilities, fp32
//   accumulation, as PyTorch's autocast runs scaled_dot_product_attention);
//   otherwise the fp32 one (GptCudaOptions::attention overrides).
// - The loss never holds more than `loss_chunk_rows` rows of logits: the
//   head's forward(last) runs, per chunk of rows, the logits GEMM, the
//   softmax cross-entropy in place (d logits), and both backward GEMMs of
//   the head: d (ln_f output) for backward(last), and the head's share of
//   d wte, accumulated over the chunks in an fp32 [Vp, C] buffer that
//   backward(0) copies into unit 0's gradients before adding the
//   embedding's (Note [Tied head], with that buffer instead of the full d
//   logits).
// - Activations are fp32 and the bf16 GEMM inputs are kept in bf16 (the
//   rounding the forward made, read again by the backward), as the host
//   model keeps them.
// - Memory: one device buffer of activations and scratch
//   (MemCategory::kActivations, workspace_bytes()), allocated by the
//   constructor; nothing is allocated in forward or backward (cuBLASLt's
//   own workspace is GemmCuda's).
// - The host never waits inside a micro-batch. Tokens go through a ring of
//   two pinned host buffers: begin_micro_batch_on waits only for the copy
//   made from the same slot two micro-batches ago. The loss and a kept
//   logits row come back by copies on the stream into pinned memory, which
//   loss() and kept_logits() read after the stream has passed them.
// - sync_each_op (MP_CUDA_SYNC=1 in mp_worker): the host synchronises after
//   every op and a device fault throws CudaError naming the op and unit,
//   instead of surfacing at a later call.
// - With the op profile on (kernels/op_profile.h, MP_OP_PROFILE=1 in
//   mp_worker) every op is timed between CUDA events into its family; the
//   times reach op_profile_take() at flush_profile() (or the next
//   micro-batch's start), which waits for them.
// Never yet run on a GPU (no device has been available to this project):
// tests/gpu/test_gpu_gpt_model.cc and scripts/gpu_check check it there.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "models/gpt.h"
#include "models/model.h"

namespace mp {

enum class GptCudaAttention : uint8_t {
  kAuto = 0,         // tensor cores for bf16 GEMMs and head sizes 64 and 128, else fp32
  kFp32 = 1,         // flash_attention_*_cuda: CUDA cores, fp32
  kTensorCores = 2,  // flash_attention_tc_*_cuda: bf16 operands (head sizes 64 and 128)
};

struct GptCudaOptions {
  bool allow_tf32 = false;      // fp32 GEMMs on TF32 tensor cores (the tf32 recipe)
  GptCudaAttention attention = GptCudaAttention::kAuto;
  int64_t loss_chunk_rows = 0;  // rows of logits at a time; 0: kGptCudaLogitsChunkBytes of fp32 logits
  bool sync_each_op = false;    // Note [GPT on CUDA]: debugging device faults
};

inline constexpr int64_t kGptCudaLogitsChunkBytes = int64_t{256} << 20;

namespace detail {
struct GptCudaState;  // the workspace, pinned buffers and op marks (models/gpt_cuda_state.h)
}

class GptCuda final : public Model, public GptControl {
 public:
  // `allocator`: the engine's, on a CUDA device (ConfigError otherwise).
  // Validates config; source null: GptData(config).
  GptCuda(const GptConfig& config, Allocator allocator, std::shared_ptr<const TokenBatchSource> source = nullptr,
          GptCudaOptions options = {});
  ~GptCuda() override;
  GptCuda(const GptCuda&) = delete;
  GptCuda& operator=(const GptCuda&) = delete;

  // The device bytes the constructor allocates (activations and scratch).
  static int64_t workspace_bytes(const GptConfig& config, const GptCudaOptions& options = {});
  // The rows of logits the loss computes at once.
  static int64_t loss_chunk_rows(const GptConfig& config, const GptCudaOptions& options = {});
  // Whether attention runs on tensor cores (kAuto resolved); ConfigError
  // for kTensorCores with a head size they do not take.
  static bool tensor_core_attention(const GptConfig& config, const GptCudaOptions& options = {});

  const ModelSpec& spec() const override { return spec_; }
  void begin_micro_batch_on(int64_t global_index, Stream& s) override;
  void forward_on(int unit, const Tensor& params, Stream& s) override;
  double loss() const override;
  void backward_on(int unit, const Tensor& params, const Tensor& grads, Stream& s) override;

  const GptConfig& config() const override { return config_; }
  void set_source(std::shared_ptr<const TokenBatchSource> source) override;
  const std::shared_ptr<const TokenBatchSource>& shared_source() const override { return source_; }
  void keep_logits_row(int64_t row) override;
  std::vector<float> kept_logits() const override;
  void flush_profile() override;

 private:
  void check_unit(int unit, const char* what) const;

  GptConfig config_;
  GptCudaOptions options_;
  ModelSpec spec_;
  std::shared_ptr<const TokenBatchSource> source_;
  std::unique_ptr<detail::GptCudaState> state_;
  int forwarded_ = 0;
  int next_backward_ = -1;
  bool loaded_ = false;
  int64_t kept_row_ = -1;
};

}  // namespace mp

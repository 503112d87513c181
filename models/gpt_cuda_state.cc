#include "models/gpt_cuda_state.h"

#include <algorithm>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/cuda/flash_attention_cuda.h"
#include "kernels/cuda/gpt_ops_cuda.h"

namespace mp::gpt_cuda {

bool tc_attention_for(const GptConfig& c, const GptCudaOptions& o) {
  const int64_t hd = c.channels / c.heads;
  switch (o.attention) {
    case GptCudaAttention::kFp32: return false;
    case GptCudaAttention::kTensorCores:
      if (!flash_attention_tc_supported(hd)) {
        MP_THROW(ConfigError, "tensor-core attention takes head sizes 64 and 128; this GPT's is ", hd);
      }
      return true;
    case GptCudaAttention::kAuto: break;
  }
  return c.matmul_dtype == DType::kBF16 && flash_attention_tc_supported(hd);
}

Dims dims_of(const GptConfig& c, const GptCudaOptions& o) {
  Dims d;
  d.batch = c.micro_batch_size;
  d.seq = c.context;
  d.channels = c.channels;
  d.heads = c.heads;
  d.layers = c.layers;
  d.vocab = c.vocab;
  d.padded_vocab = gpt_padded_vocab(c.vocab);
  d.rows = d.batch * d.seq;
  const int64_t by_bytes = std::max<int64_t>(1, kGptCudaLogitsChunkBytes / (d.padded_vocab * 4));
  d.chunk = std::min(d.rows, o.loss_chunk_rows > 0 ? o.loss_chunk_rows : by_bytes);
  d.tc_attention = tc_attention_for(c, o);
  return d;
}

namespace {

// Hands out 256-byte aligned ranges of one buffer; with a null base it only counts.
class ByteCarver {
 public:
  explicit ByteCarver(char* base) : base_(base) {}
  template <class T>
  T* take(int64_t n) {
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += (n * static_cast<int64_t>(sizeof(T)) + 255) / 256 * 256;
    return p;
  }
  int64_t used() const { return used_; }

 private:
  char* base_;
  int64_t used_ = 0;
};

}  // namespace

Buffers carve(const Dims& d, const std::vector<DType>& op_dtype, int64_t max_unit_numel, int64_t emb_ws_bytes,
              char* base, int64_t* bytes) {
  ByteCarver k(base);
  const int64_t nc = d.rows * d.channels;
  Buffers b;
  b.tokens = k.take<int32_t>(2 * d.rows);
  b.residual.push_back(k.take<float>(nc));
  for (int64_t l = 0; l < d.layers; ++l) {
    Layer y{};
    y.ln1 = k.take<float>(nc);
    y.ln1_mean = k.take<float>(d.rows);
    y.ln1_rstd = k.take<float>(d.rows);
    y.qkv = k.take<float>(3 * nc);
    y.atty = k.take<float>(nc);
    y.lse = k.take<float>(d.batch * d.heads * d.seq);
    y.res2 = k.take<float>(nc);
    y.ln2 = k.take<float>(nc);
    y.ln2_mean = k.take<float>(d.rows);
    y.ln2_rstd = k.take<float>(d.rows);
    y.fch = k.take<float>(4 * nc);
    y.fch_gelu = k.take<float>(4 * nc);
    b.layers.push_back(y);
    b.residual.push_back(k.take<float>(nc));
  }
  b.lnf = k.take<float>(nc);
  b.lnf_mean = k.take<float>(d.rows);
  b.lnf_rstd = k.take<float>(d.rows);
  b.row_loss = k.take<float>(d.rows);
  b.mean_loss = k.take<double>(1);
  const bool bf16_head = op_dtype.back() == DType::kBF16;
  const int64_t wte_numel = d.padded_vocab * d.channels;
  b.wte_head = bf16_head ? static_cast<void*>(k.take<bf16>(wte_numel)) : static_cast<void*>(k.take<float>(wte_numel));
  b.logits = k.take<float>(d.chunk * d.padded_vocab);
  if (bf16_head) b.dlogits16 = k.take<bf16>(d.chunk * d.padded_vocab);
  b.dwte_head = k.take<float>(wte_numel);
  b.dlnf = k.take<float>(nc);
  b.dres = k.take<float>(nc);
  b.dln = k.take<float>(nc);
  b.datty = k.take<float>(nc);
  b.dqkv = k.take<float>(3 * nc);
  b.dfch = k.take<float>(4 * nc);
  b.att_scratch = k.take<float>(flash_attention_backward_scratch_elements(d.batch, d.seq, d.heads));
  bool any_bf16 = false;
  for (size_t i = 0; i < op_dtype.size(); ++i) {
    const bool mlp_proj = i + 1 < op_dtype.size() && i % kBlockOps == kMlpCProj;
    const bool is_bf16 = op_dtype[i] == DType::kBF16;
    any_bf16 = any_bf16 || is_bf16;
    b.x16.push_back(is_bf16 ? k.take<bf16>(mlp_proj ? 4 * nc : nc) : nullptr);
  }
  if (any_bf16) {
    b.dy16 = k.take<bf16>(4 * nc);
    b.w16 = k.take<bf16>(std::max(4 * d.channels * d.channels, wte_numel));
  }
  b.param_ws = k.take<float>(max_unit_numel);
  b.kept = k.take<float>(d.padded_vocab);
  b.ln_ws = k.take<char>(gpt_layernorm_backward_cuda_workspace_bytes(d.rows, d.channels));
  b.bias_ws = k.take<char>(gpt_bias_backward_cuda_workspace_bytes(d.rows, 4 * d.channels));
  b.emb_ws = k.take<char>(emb_ws_bytes);
  b.emb_ws_bytes = emb_ws_bytes;
  *bytes = k.used();
  return b;
}

int64_t workspace_bytes(const Dims& d, const std::vector<DType>& op_dtype, const std::vector<UnitLayout>& layout) {
  int64_t bytes = 0;
  carve(d, op_dtype, max_unit_numel(layout), gpt_embedding_backward_cuda_workspace_bytes(d.rows, d.vocab), nullptr,
        &bytes);
  return bytes;
}

int64_t max_unit_numel(const std::vector<UnitLayout>& layout) {
  int64_t n = 0;
  for (const UnitLayout& u : layout) n = std::max(n, u.numel);
  return n;
}

Pinned::Pinned(size_t bytes) { MP_CHECK_CUDA(cudaMallocHost(&p, bytes)); }
Pinned::~Pinned() { (void)cudaFreeHost(p); }

}  // namespace mp::gpt_cuda

namespace mp::detail {

GptCudaState::GptCudaState(const GptConfig& config, const GptCudaOptions& options, const ModelSpec& spec, Allocator& allocator)
    : device(allocator.device()), d(gpt_cuda::dims_of(config, options)), op_dtype(gpt_matmul_op_dtypes(config)),
      layout(FlatLayout(spec, 1).units()), gemm{options.allow_tf32}, sync_each_op(options.sync_each_op),
      host_tokens(2 * static_cast<size_t>(2 * d.rows) * sizeof(int32_t)),
      host_scalars(sizeof(double) + static_cast<size_t>(d.padded_vocab) * sizeof(float)) {
  CudaDeviceGuard guard(device);
  int64_t bytes = gpt_cuda::workspace_bytes(d, op_dtype, layout);
  ws = allocator.allocate(static_cast<size_t>(bytes), MemCategory::kActivations);
  b = gpt_cuda::carve(d, op_dtype, gpt_cuda::max_unit_numel(layout),
                      gpt_embedding_backward_cuda_workspace_bytes(d.rows, d.vocab), static_cast<char*>(ws.data()),
                      &bytes);
  for (cudaEvent_t& e : token_copied) MP_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}
GptCudaState::~GptCudaState() {
  // The stream may still read the pinned buffers: wait for the device.
  (void)cudaSetDevice(device.index);
  (void)cudaDeviceSynchronize();
  for (cudaEvent_t e : token_copied) (void)cudaEventDestroy(e);
  for (const auto* events : {&free_events, &used_events}) {
    for (cudaEvent_t e : *events) (void)cudaEventDestroy(e);
  }
}

void GptCudaState::begin_call(cudaStream_t st) {
  profiling = op_profile_enabled();
  if (!profiling) return;
  previous = take_event();
  MP_CHECK_CUDA(cudaEventRecord(previous, st));
}

void GptCudaState::mark(OpFamily family, const char* op, int unit, cudaStream_t st) {
  if (profiling) {
    cudaEvent_t e = take_event();
    MP_CHECK_CUDA(cudaEventRecord(e, st));
    pending.push_back(Timed{family, previous, e});
    previous = e;
  }
  if (!sync_each_op) return;
  const cudaError_t err = cudaStreamSynchronize(st);
  if (err != cudaSuccess) {
    MP_THROW(CudaError, "GPT op ", op, " of unit ", layout[static_cast<size_t>(unit)].name, " on ",
             to_string(device), " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  }
}

void GptCudaState::flush_profile() {
  for (const Timed& t : pending) {
    MP_CHECK_CUDA(cudaEventSynchronize(t.end));
    float ms = 0;
    MP_CHECK_CUDA(cudaEventElapsedTime(&ms, t.start, t.end));
    detail::op_profile_add(t.family, ms / 1e3);
  }
  pending.clear();
  free_events.insert(free_events.end(), used_events.begin(), used_events.end());
  used_events.clear();
  previous = nullptr;
}

cudaEvent_t GptCudaState::take_event() {
  if (free_events.empty()) {
    cudaEvent_t e = nullptr;
    MP_CHECK_CUDA(cudaEventCreate(&e));  // timed
    free_events.push_back(e);
  }
  cudaEvent_t e = free_events.back();
  free_events.pop_back();
  used_events.push_back(e);
  return e;
}

}  // namespace mp::detail

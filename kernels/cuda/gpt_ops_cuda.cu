// kernels/cuda/gpt_ops_cuda.cu: the GPT-2 layer kernels (everything but the
// GEMMs) in fp32, deterministic (Note [GPT CUDA kernels] in gpt_ops_cuda.h):
// each op's kernels, then the launchers. The block reductions are packed.cuh's.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/convert_math.h"
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/gpt_ops_cuda.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/packed.cuh"
#include "kernels/gpt_math.h"

namespace mp {
namespace {

using cuda_launch::kThreads;
using cuda_packed::block_max;
using cuda_packed::block_sum;

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// The bias gradient's term of cuda_column::column_sums: dy itself.
struct BiasTerm {
  const float* dy;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t c, float* acc) const { acc[0] += dy[r * cols + c]; }
};

// ---- embedding ------------------------------------------------------------------

// wte fp32, or bf16 widened exactly (math::to_f32): the same sums.
template <class E>
__global__ void embedding_forward_kernel(const int32_t* tokens, const E* wte, const float* wpe, int64_t seq,
                                         int64_t channels, int64_t vocab_rows, int64_t count, float* out) {
  for (int64_t i = global_thread(); i < count; i += grid_threads()) {
    const int64_t n = i / channels, c = i % channels;
    const int32_t token = tokens[n];
    out[i] = token >= 0 && token < vocab_rows ? math::to_f32(wte[token * channels + c]) + wpe[(n % seq) * channels + c]
                                              : __int_as_float(0x7fc00000);  // NaN
  }
}

// The same, eight channels per thread step with 16-byte accesses
// (channels a multiple of 8, every row 16-byte aligned): the same sums.
template <class E>
__global__ void embedding_forward_vec_kernel(const int32_t* tokens, const E* wte, const float* wpe, int64_t seq,
                                             int64_t channels, int64_t vocab_rows, int64_t count, float* out) {
  constexpr int kVec = 8;
  for (int64_t v = global_thread(); v < count / kVec; v += grid_threads()) {
    const int64_t i = v * kVec, n = i / channels, c = i % channels;
    const int32_t token = tokens[n];
    const bool valid = token >= 0 && token < vocab_rows;
    float e[kVec];
    if (!valid) {
      for (float& x : e) x = __int_as_float(0x7fc00000);  // NaN
    } else if constexpr (std::is_same_v<E, bf16>) {
      const auto w = cuda_packed::load128(wte + token * channels + c);
#pragma unroll
      for (int k = 0; k < kVec; ++k) e[k] = math::to_f32(w.v[k]);
    } else {
      const auto w0 = cuda_packed::load128(wte + token * channels + c), w1 = cuda_packed::load128(wte + token * channels + c + 4);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        e[k] = w0.v[k];
        e[k + 4] = w1.v[k];
      }
    }
    const float* p = wpe + (n % seq) * channels + c;
    const auto p0 = cuda_packed::load128(p), p1 = cuda_packed::load128(p + 4);
    cuda_packed::Packed128<float> o0, o1;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o0.v[k] = e[k] + p0.v[k];
      o1.v[k] = e[k + 4] + p1.v[k];
    }
    cuda_packed::store128(out + i, o0);
    cuda_packed::store128(out + i + 4, o1);
  }
}

// Sort keys: the token, or vocab_rows (after every valid token) when invalid.
__global__ void embedding_keys_kernel(const int32_t* tokens, int64_t rows, int64_t vocab_rows, uint32_t* keys,
                                      int32_t* row_ids) {
  for (int64_t n = global_thread(); n < rows; n += grid_threads()) {
    const int32_t token = tokens[n];
    keys[n] = static_cast<uint32_t>(token >= 0 && token < vocab_rows ? token : vocab_rows);
    row_ids[n] = static_cast<int32_t>(n);
  }
}

// Block i on channels blockIdx.y * blockDim.x ..: if sorted position i starts
// a token's run, adds the run's rows (stable sort: increasing row order).
__global__ void embedding_wte_backward_kernel(const uint32_t* keys, const int32_t* row_ids, const float* dout,
                                              int64_t rows, int64_t channels, uint32_t invalid, float* dwte) {
  const int64_t i = blockIdx.x, c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const uint32_t key = keys[i];
  if (c >= channels || key == invalid || (i > 0 && keys[i - 1] == key)) return;
  float* e = dwte + static_cast<int64_t>(key) * channels + c;
  float acc = *e;
  for (int64_t j = i; j < rows && keys[j] == key; ++j) acc += dout[static_cast<int64_t>(row_ids[j]) * channels + c];
  *e = acc;
}

// dwpe[t, c] += dout[b * seq + t, c] for b in increasing order.
__global__ void embedding_wpe_backward_kernel(const float* dout, int64_t batch, int64_t seq, int64_t channels,
                                              float* dwpe) {
  for (int64_t i = global_thread(); i < seq * channels; i += grid_threads()) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < batch; ++b) acc += dout[b * seq * channels + i];
    dwpe[i] = acc;
  }
}

// Workspace of the embedding backward: keys and row ids, in and out of the
// sort, then CUB's scratch; each 256-byte aligned.
struct EmbeddingWorkspace {
  int64_t array_bytes, cub_bytes;
  int end_bit;
};
int64_t align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

EmbeddingWorkspace embedding_workspace(int64_t rows, int64_t vocab_rows) {
  MP_ENFORCE(rows >= 0 && rows <= INT32_MAX && vocab_rows > 0 && vocab_rows < INT32_MAX,
             "embedding backward of ", rows, " rows over ", vocab_rows, " vocabulary rows");
  EmbeddingWorkspace w;
  w.array_bytes = align256(std::max<int64_t>(rows, 1) * 4);
  w.end_bit = std::bit_width(static_cast<uint64_t>(vocab_rows));  // vocab_rows itself is the invalid key
  size_t cub_bytes = 0;
  MP_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const uint32_t*>(nullptr),
                                                static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<int>(rows), 0, w.end_bit));
  w.cub_bytes = align256(static_cast<int64_t>(cub_bytes));
  return w;
}

// ---- loss ---------------------------------------------------------------------------

__global__ void softmax_xent_kernel(const float* logits, const int32_t* targets, int64_t vocab, int64_t padded_vocab,
                                    float scale, float* row_loss, float* dlogits) {
  const int64_t n = blockIdx.x;
  const float* z = logits + n * padded_vocab;
  float* dz = dlogits + n * padded_vocab;
  const int32_t target = targets[n];
  const bool valid = target >= 0 && target < vocab;
  float local_max = -INFINITY;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) local_max = fmaxf(local_max, z[c]);
  const float m = block_max(local_max);
  // Read before the block reduction below: every write to dz comes after
  // its barrier, so dlogits may alias logits.
  const float z_target = valid ? z[target] : 0.0f;
  float local_sum = 0.0f;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) local_sum += math::exp_approx(z[c] - m);
  const float sum = block_sum(local_sum);
  const float inv_sum = 1.0f / sum, nan = __int_as_float(0x7fc00000);
  for (int64_t c = threadIdx.x; c < padded_vocab; c += blockDim.x) {
    float d = 0.0f;
    if (c < vocab) {
      d = math::exp_approx(z[c] - m) * inv_sum * scale;
      if (c == target) d -= scale;
      if (!valid) d = nan;
    }
    dz[c] = d;
  }
  if (threadIdx.x == 0) row_loss[n] = valid ? logf(sum) + m - z_target : nan;
}

__global__ void mean_loss_kernel(const float* row_loss, int64_t rows, double* mean_loss) {
  double acc = 0.0;
  for (int64_t n = threadIdx.x; n < rows; n += blockDim.x) acc += static_cast<double>(row_loss[n]);
  acc = block_sum(acc);
  if (threadIdx.x == 0) *mean_loss = acc / static_cast<double>(rows);
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------

template <class E>
void embedding_forward(const int32_t* tokens, const E* wte, const float* wpe, int64_t batch, int64_t seq,
                       int64_t channels, int64_t vocab_rows, float* out, cudaStream_t stream) {
  MP_ENFORCE(batch >= 0 && seq >= 0 && channels >= 0 && vocab_rows > 0, "embedding of batch ", batch, ", seq ",
             seq, ", channels ", channels, ", vocab rows ", vocab_rows);
  const int64_t count = batch * seq * channels;
  if (count == 0) return;
  MP_ENFORCE(tokens != nullptr && wte != nullptr && wpe != nullptr && out != nullptr, "embedding of null memory");
  if (channels % 8 == 0 && cuda_packed::aligned16(wte) && cuda_packed::aligned16(wpe) && cuda_packed::aligned16(out)) {
    launch_kernel(&embedding_forward_vec_kernel<E>, cuda_launch::grid_stride("embedding_forward_vec_kernel", count / 8),
                  stream, tokens, wte, wpe, seq, channels, vocab_rows, count, out);
  } else {
    launch_kernel(&embedding_forward_kernel<E>, cuda_launch::grid_stride("embedding_forward_kernel", count), stream,
                  tokens, wte, wpe, seq, channels, vocab_rows, count, out);
  }
}

void gpt_embedding_forward_cuda(const int32_t* tokens, const float* wte, const float* wpe, int64_t batch,
                                int64_t seq, int64_t channels, int64_t vocab_rows, float* out, cudaStream_t stream) {
  embedding_forward(tokens, wte, wpe, batch, seq, channels, vocab_rows, out, stream);
}

void gpt_embedding_forward_cuda(const int32_t* tokens, const bf16* wte, const float* wpe, int64_t batch,
                                int64_t seq, int64_t channels, int64_t vocab_rows, float* out, cudaStream_t stream) {
  embedding_forward(tokens, wte, wpe, batch, seq, channels, vocab_rows, out, stream);
}

int64_t gpt_embedding_backward_cuda_workspace_bytes(int64_t rows, int64_t vocab_rows) {
  const EmbeddingWorkspace w = embedding_workspace(rows, vocab_rows);
  return 4 * w.array_bytes + w.cub_bytes;
}

void gpt_embedding_backward_cuda(const int32_t* tokens, const float* dout, int64_t batch, int64_t seq,
                                 int64_t channels, int64_t vocab_rows, float* dwte, float* dwpe, void* workspace,
                                 int64_t workspace_bytes, cudaStream_t stream) {
  MP_ENFORCE(batch >= 0 && seq >= 0 && channels >= 0, "embedding backward of batch ", batch, ", seq ", seq,
             ", channels ", channels);
  const int64_t rows = batch * seq;
  if (rows == 0 || channels == 0) return;
  MP_ENFORCE(tokens != nullptr && dout != nullptr && dwte != nullptr && dwpe != nullptr && workspace != nullptr,
             "embedding backward of null memory");
  const EmbeddingWorkspace w = embedding_workspace(rows, vocab_rows);
  MP_ENFORCE_GE(workspace_bytes, 4 * w.array_bytes + w.cub_bytes, "embedding backward workspace");
  MP_ENFORCE(channels <= int64_t{kThreads} * 65535, "embedding backward of ", channels, " channels");
  auto* bytes = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<uint32_t*>(bytes);
  auto* keys_out = reinterpret_cast<uint32_t*>(bytes + w.array_bytes);
  auto* ids_in = reinterpret_cast<int32_t*>(bytes + 2 * w.array_bytes);
  auto* ids_out = reinterpret_cast<int32_t*>(bytes + 3 * w.array_bytes);
  launch_kernel(&embedding_keys_kernel, cuda_launch::grid_stride("embedding_keys_kernel", rows), stream, tokens, rows,
                vocab_rows, keys_in, ids_in);
  auto cub_bytes = static_cast<size_t>(w.cub_bytes);
  MP_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(bytes + 4 * w.array_bytes, cub_bytes, keys_in, keys_out, ids_in,
                                                ids_out, static_cast<int>(rows), 0, w.end_bit, stream));
  launch_kernel(&embedding_wte_backward_kernel, cuda_launch::embedding_wte_backward(rows, channels), stream,
                static_cast<const uint32_t*>(keys_out), static_cast<const int32_t*>(ids_out), dout, rows, channels,
                static_cast<uint32_t>(vocab_rows), dwte);
  launch_kernel(&embedding_wpe_backward_kernel,
                cuda_launch::grid_stride("embedding_wpe_backward_kernel", seq * channels), stream, dout, batch, seq,
                channels, dwpe);
}

int64_t gpt_bias_backward_cuda_workspace_bytes(int64_t rows, int64_t out) {
  return cuda_column::workspace_bytes(rows, out, 1);
}

void gpt_bias_backward_cuda(const float* dy, int64_t rows, int64_t out, float* db, void* workspace,
                            cudaStream_t stream) {
  MP_ENFORCE(rows >= 0 && out >= 0, "bias backward of ", rows, " x ", out);
  if (out == 0) return;
  MP_ENFORCE(db && workspace && (rows == 0 || dy), "bias backward of null memory");
  cuda_column::column_sums<1>(BiasTerm{dy, out}, rows, out, cuda_column::Outputs{{db, nullptr}}, workspace, stream);
}

void gpt_softmax_xent_rows_cuda(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                                int64_t padded_vocab, int64_t loss_rows, float* row_loss, float* dlogits,
                                cudaStream_t stream) {
  MP_ENFORCE(vocab > 0 && vocab <= padded_vocab, "vocab ", vocab, " with padded vocab ", padded_vocab);
  MP_ENFORCE(rows >= 0 && rows <= INT32_MAX && loss_rows >= rows, "cross-entropy of ", rows, " rows of ",
             loss_rows);
  if (rows == 0) return;
  MP_ENFORCE(logits && targets && row_loss && dlogits, "cross-entropy of null memory");
  launch_kernel(&softmax_xent_kernel, cuda_launch::softmax_xent(rows), stream, logits, targets, vocab, padded_vocab,
                1.0f / static_cast<float>(loss_rows), row_loss, dlogits);
}

void gpt_mean_loss_cuda(const float* row_loss, int64_t rows, double* mean_loss, cudaStream_t stream) {
  MP_ENFORCE(rows > 0 && row_loss && mean_loss, "mean loss of ", rows, " rows");
  launch_kernel(&mean_loss_kernel, cuda_launch::mean_loss(), stream, row_loss, rows, mean_loss);
}

}  // namespace mp

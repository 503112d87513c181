// kernels/cuda/classifier_cuda.cu: the fused classifier (Note [Classifier
// kernel] in classifier_cuda.h).
#include <cmath>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/cuda/classifier_cuda.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/packed.cuh"
#include "kernels/gpt_math.h"

namespace mp {
namespace {

using cuda_packed::block_max;
using cuda_packed::block_sum;
using cuda_packed::from_f32;
using cuda_packed::load128;
using cuda_packed::Packed128;
using cuda_packed::store128;
using cuda_packed::to_f32;

constexpr int kThreads = cuda_launch::kClassifierThreads;

// The running (max, sum of exp(x - max)) of a thread, with x added.
__device__ __forceinline__ void online_add(float x, float& m, float& s) {
  if (x > m) {
    s = s * math::gpt_exp(m - x) + 1.0f;
    m = x;
  } else {
    s += math::gpt_exp(x - m);
  }
}

template <class T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    classifier_kernel(T* logits, const int32_t* targets, int64_t rows, int vocab, int padded_vocab, float scale,
                      bool round, float* row_loss) {
  constexpr int kVec = Packed128<T>::kSize;
  const int64_t row = rows - 1 - static_cast<int64_t>(blockIdx.x);
  T* z = logits + row * padded_vocab;
  const int target = targets[row];
  const bool valid = target >= 0 && target < vocab;
  __shared__ float z_target;
  if (threadIdx.x == 0) z_target = valid ? to_f32(z[target]) : NAN;  // read before anything is overwritten
  // The statistics.
  float m = -INFINITY, s = 0.0f;
  if constexpr (kVector) {
    for (int j = static_cast<int>(threadIdx.x) * kVec; j < padded_vocab; j += kThreads * kVec) {
      const Packed128<T> v = load128(z + j);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (j + k < vocab) online_add(to_f32(v.v[k]), m, s);
      }
    }
  } else {
    for (int j = static_cast<int>(threadIdx.x); j < vocab; j += kThreads) online_add(to_f32(z[j]), m, s);
  }
  const float row_max = block_max(m);
  // A thread with no elements has s = 0: its term is 0 whatever m is.
  const float sum = block_sum(s * math::gpt_exp(m - row_max));
  const float inv_sum = 1.0f / sum;
  if (threadIdx.x == 0) row_loss[row] = valid ? logf(sum) + row_max - z_target : NAN;
  // The gradient, in place.
  const float nan = valid ? 0.0f : NAN;
  auto grad = [&](int j, float x) {
    if (j >= vocab) return 0.0f;
    float g = math::gpt_exp(x - row_max) * inv_sum * scale;
    if (j == target) g -= scale;
    return g + nan;
  };
  if constexpr (kVector) {
    for (int j = static_cast<int>(threadIdx.x) * kVec; j < padded_vocab; j += kThreads * kVec) {
      Packed128<T> v = load128(z + j);
#pragma unroll
      for (int k = 0; k < kVec; ++k) v.v[k] = from_f32<T>(grad(j + k, to_f32(v.v[k])), round);
      store128(z + j, v);
    }
  } else {
    for (int j = static_cast<int>(threadIdx.x); j < padded_vocab; j += kThreads) {
      z[j] = from_f32<T>(grad(j, to_f32(z[j])), round);
    }
  }
}

template <class T>
void launch(const Act& logits, const int32_t* targets, int64_t rows, int64_t vocab, int64_t padded_vocab, float scale,
            float* row_loss, cudaStream_t stream) {
  auto* z = static_cast<T*>(logits.data);
  const auto pv = static_cast<int>(padded_vocab), v = static_cast<int>(vocab);
  const bool vector = padded_vocab % Packed128<T>::kSize == 0 && cuda_packed::aligned16(z);
  launch_kernel(vector ? &classifier_kernel<T, true> : &classifier_kernel<T, false>, cuda_launch::classifier(rows),
                stream, z, targets, rows, v, pv, scale, logits.bf16, row_loss);
}

}  // namespace

void gpt_classifier_cuda(Act logits, const int32_t* targets, int64_t rows, int64_t vocab, int64_t padded_vocab,
                         int64_t loss_rows, float* row_loss, cudaStream_t stream) {
  MP_ENFORCE(vocab > 0 && vocab <= padded_vocab && padded_vocab < (int64_t{1} << 30), "vocab ", vocab,
             " with padded vocab ", padded_vocab);
  MP_ENFORCE(rows >= 0 && rows <= loss_rows && rows < (int64_t{1} << 31), "a chunk of ", rows,
             " rows of a loss over ", loss_rows);
  MP_ENFORCE(logits.dtype == DType::kF32 || (logits.dtype == DType::kBF16 && logits.bf16), "logits stored as ",
             dtype_name(logits.dtype));
  if (rows == 0) return;
  MP_ENFORCE(logits.data != nullptr && targets != nullptr && row_loss != nullptr, "classifier: a null pointer");
  const float scale = 1.0f / static_cast<float>(loss_rows);
  if (logits.dtype == DType::kBF16) {
    launch<bf16>(logits, targets, rows, vocab, padded_vocab, scale, row_loss, stream);
  } else {
    launch<float>(logits, targets, rows, vocab, padded_vocab, scale, row_loss, stream);
  }
}

}  // namespace mp

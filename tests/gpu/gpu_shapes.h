// tests/gpu/gpu_shapes.h: the shapes at which the GPU tests run the kernels
// whose launch depends on the shape, and the launch configurations of the
// tests' own kernels (Note [CUDA launch configurations] in
// kernels/cuda_launch.h). CTest gpu_launch_limits
// (tests/test_gpu_launch_limits.cc) checks those kernels' launch
// configurations at every one of them, on every build.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_launch.h"

namespace mp::gpu_shapes {

struct LayerNorm {
  int64_t rows, channels;
};
// A scalar row (37), 16-byte rows (768), one element, more rows than one
// block's (3001), Llama-70B's width (8192), a wide row of scalar steps
// (4100), and more rows than 1024 blocks of 32 (40000).
inline constexpr LayerNorm kLayerNorm[] = {{6, 37},    {200, 768}, {1, 1},     {3001, 64},
                                           {40, 8192}, {70, 4100}, {40000, 72}};

struct Classifier {
  int64_t rows, vocab, padded_vocab;
};
inline constexpr Classifier kClassifier[] = {{7, 50, 64}, {3, 1000, 1000}, {5, 50257, 50304}};

struct Attention {
  int64_t batch, seq, channels, heads;
};
// The reference kernels (gpt_attention_*_cuda, tests/gpu/reference_attention.h).
inline constexpr Attention kReferenceAttention[] = {{2, 9, 12, 3}, {1, 130, 16, 2}, {1, 1, 4, 4}};
// Their launches: one block per query row, with a head_dim vector and a row
// of seq scores, and one block_max's and one block_sum's warp slots; dqkv's
// block covers head_dim in whole warps.
inline constexpr int kAttentionThreads = 128;
inline LaunchConfig attention_rows(const char* kernel, int64_t batch, int64_t seq, int64_t channels, int64_t heads) {
  constexpr int64_t kFloat = sizeof(float);
  return LaunchConfig{kernel, {batch * heads * seq}, {kAttentionThreads}, (seq + channels / heads) * kFloat,
                      2 * cuda_launch::kWarp * kFloat};
}
inline LaunchConfig attention_dqkv(int64_t batch, int64_t seq, int64_t channels, int64_t heads) {
  const int64_t warps = (channels / heads + cuda_launch::kWarp - 1) / cuda_launch::kWarp;
  return LaunchConfig{"attention_dqkv_kernel", {batch * heads * seq},
                      {std::min<int64_t>(kAttentionThreads, warps * cuda_launch::kWarp)}};
}
// The fp32 flash kernels.
inline constexpr Attention kFlashAttention[] = {{2, 37, 16, 2},   {1, 70, 64, 2},   {2, 65, 128, 2},
                                                {1, 33, 384, 3},  {1, 1, 64, 1},    {3, 96, 256, 2},
                                                {1, 200, 128, 2}, {2, 300, 256, 2}, {2, 70, 32, 4}};

}  // namespace mp::gpu_shapes

// kernels/cuda/column_sums.cuh: out_s[c] = the sum over rows r of
// term_s(r, c), in two passes: chunk j of rows_per_chunk rows gives
// partials[s][j][c] (one thread per column, rows in order); then one thread
// per column adds the chunks in order. The same inputs give the same bits.
// Launch configurations: kernels/cuda_launch.h. CUDA sources only.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda_launch.h"

namespace mp::cuda_column {

inline int64_t workspace_bytes(int64_t rows, int64_t cols, int sums) {
  return sums * cuda_launch::column_chunks(rows).chunks * cols * static_cast<int64_t>(sizeof(float));
}

// Term: a functor `term(r, c, acc)` adding row r's terms of column c into acc[0 .. kSums).
template <int kSums, class Term>
__global__ void column_partials_kernel(Term term, int64_t rows, int64_t cols, int64_t rows_per_chunk, float* partials) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, chunk = blockIdx.y;
  if (c >= cols) return;
  float acc[kSums] = {};
  const int64_t r1 = std::min(rows, (chunk + 1) * rows_per_chunk);
  for (int64_t r = chunk * rows_per_chunk; r < r1; ++r) term(r, c, acc);
  for (int s = 0; s < kSums; ++s) partials[(s * static_cast<int64_t>(gridDim.y) + chunk) * cols + c] = acc[s];
}

struct Outputs {
  float* out[2];
};

template <int kSums>
__global__ void column_finish_kernel(const float* partials, int64_t chunks, int64_t cols, Outputs outs) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += stride) {
    for (int s = 0; s < kSums; ++s) {
      float acc = 0.0f;
      for (int64_t j = 0; j < chunks; ++j) acc += partials[(s * chunks + j) * cols + c];
      outs.out[s][c] = acc;
    }
  }
}

// `workspace`: workspace_bytes(rows, cols, kSums).
template <int kSums, class Term>
void column_sums(Term term, int64_t rows, int64_t cols, Outputs outs, void* workspace, cudaStream_t stream) {
  const cuda_launch::ColumnChunks ch = cuda_launch::column_chunks(rows);
  auto* partials = static_cast<float*>(workspace);
  launch_kernel(&column_partials_kernel<kSums, Term>, cuda_launch::column_partials(rows, cols), stream, term, rows,
                cols, ch.rows_per_chunk, partials);
  launch_kernel(&column_finish_kernel<kSums>, cuda_launch::grid_stride("column_finish_kernel", cols), stream,
                static_cast<const float*>(partials), ch.chunks, cols, outs);
}

}  // namespace mp::cuda_column

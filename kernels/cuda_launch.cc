// kernels/cuda_launch.cc: Note [CUDA launch configurations] in cuda_launch.h.
#include "kernels/cuda_launch.h"

#include <algorithm>

namespace mp {

namespace cuda_launch {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

LaunchConfig config(const char* kernel, LaunchDims grid, LaunchDims block, int64_t dynamic_smem = 0,
                    int64_t static_smem = 0) {
  return LaunchConfig{kernel, grid, block, dynamic_smem, static_smem};
}

// A block-wide reduction's shared memory: one T per warp (block_sum and
// block_max in kernels/cuda/packed.cuh), `count` of them in one kernel.
constexpr int64_t warp_slots(int64_t bytes, int count = 1) { return count * kWarp * bytes; }

// The fp32 flash kernels' staged tiles: `tiles` tiles of kFlashTile rows of
// head_dim + 1 floats, and `extra` floats (flash_attention.cu).
int64_t flash_tile_bytes(int64_t head_dim, int tiles, int64_t extra) {
  return (tiles * kFlashTile * (head_dim + 1) + extra) * static_cast<int64_t>(sizeof(float));
}
LaunchDims flash_grid(int64_t batch, int64_t seq, int64_t heads) {
  return LaunchDims{ceil_div(seq, kFlashRows), batch * heads, 1};
}

}  // namespace

LaunchConfig grid_stride(const char* kernel, int64_t work, int64_t max_blocks, int threads) {
  return config(kernel, {std::clamp<int64_t>(ceil_div(work, threads), 1, max_blocks)}, {threads});
}

// ---- LayerNorm -----------------------------------------------------------------------

int64_t layernorm_backward_rows_per_block(int64_t rows) {
  return std::max(kLnMinRowsPerBlock, ceil_div(rows, kLnMaxBackwardBlocks));
}

LaunchConfig layernorm_forward(int64_t rows) {
  return config("layernorm_forward_kernel", {std::max<int64_t>(1, ceil_div(rows, kLnWarps))}, {kLnThreads});
}

LaunchConfig layernorm_backward(int64_t rows) {
  // The warps' partial column tiles (dw and db).
  const int64_t tiles = int64_t{kLnWarps} * 2 * kLnTile * static_cast<int64_t>(sizeof(float));
  return config("layernorm_backward_kernel",
                {std::max<int64_t>(1, ceil_div(rows, layernorm_backward_rows_per_block(rows)))}, {kLnThreads}, 0,
                tiles);
}

LaunchConfig layernorm_backward_sum(int64_t channels) {
  const int64_t slices = int64_t{kLnSumSlices} * kLnSumColumns * static_cast<int64_t>(sizeof(float));
  return config("layernorm_backward_sum_kernel", {ceil_div(2 * channels, kLnSumColumns)}, {kLnSumColumns, kLnSumSlices},
                0, slices);
}

// ---- GPT element ops ---------------------------------------------------------------------

ColumnChunks column_chunks(int64_t rows) {
  const int64_t per = std::max(kColumnMinRowsPerChunk, ceil_div(rows, kColumnMaxChunks));
  return ColumnChunks{per, std::max<int64_t>(1, ceil_div(rows, per))};
}

LaunchConfig column_partials(int64_t rows, int64_t cols) {
  return config("column_partials_kernel", {ceil_div(cols, kThreads), column_chunks(rows).chunks}, {kThreads});
}

LaunchConfig embedding_wte_backward(int64_t rows, int64_t channels) {
  return config("embedding_wte_backward_kernel", {rows, ceil_div(channels, kThreads)}, {kThreads});
}

LaunchConfig softmax_xent(int64_t rows) {
  return config("softmax_xent_kernel", {rows}, {kXentThreads}, 0, warp_slots(sizeof(float), 2));
}

LaunchConfig mean_loss() { return config("mean_loss_kernel", {1}, {1024}, 0, warp_slots(sizeof(double))); }

LaunchConfig classifier(int64_t rows) {
  // block_max, block_sum and the target's logit.
  return config("classifier_kernel", {rows}, {kClassifierThreads}, 0, warp_slots(sizeof(float), 2) + 16);
}

// ---- flash attention --------------------------------------------------------------------

LaunchConfig flash_forward(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim) {
  return config("flash_forward_kernel", flash_grid(batch, seq, heads), {kFlashRows * kWarp},
                flash_tile_bytes(head_dim, 2, kFlashRows * head_dim));
}

LaunchConfig flash_dq(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim) {
  return config("flash_dq_kernel", flash_grid(batch, seq, heads), {kFlashRows * kWarp},
                flash_tile_bytes(head_dim, 2, 2 * kFlashRows * head_dim));
}

LaunchConfig flash_dkv(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim) {
  return config("flash_dkv_kernel", flash_grid(batch, seq, heads), {kFlashRows * kWarp},
                flash_tile_bytes(head_dim, 2, 2 * kFlashTile + 2 * kFlashRows * head_dim));
}

LaunchConfig flash_delta(int64_t rows, int64_t heads) {
  return config("flash_delta_kernel", {std::max<int64_t>(1, ceil_div(rows * heads * kWarp, kFlashDeltaThreads))},
                {kFlashDeltaThreads});
}

// ---- gradient statistics, the update -------------------------------------------------------

// A double and an int per thread (the block's fixed-tree sum).
constexpr int64_t kGradStatsSmemBytes = kThreads * static_cast<int64_t>(sizeof(double) + sizeof(int));

LaunchConfig grad_stats_partials(int64_t n) {
  LaunchConfig c = grid_stride("partials_kernel", n, kGradStatsMaxBlocks);
  c.static_smem_bytes = kGradStatsSmemBytes;
  return c;
}

LaunchConfig grad_stats_finish() { return config("finish_kernel", {1}, {kThreads}, 0, kGradStatsSmemBytes); }

LaunchConfig update(int64_t work) { return grid_stride("update_kernel", work, 8192); }

LaunchConfig device_fault() { return config("device_fault_kernel", {1}, {1}); }

}  // namespace cuda_launch
}  // namespace mp

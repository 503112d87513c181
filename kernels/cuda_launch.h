// kernels/cuda_launch.h: how each CUDA kernel of mp is launched (grid,
// block, dynamic and static shared memory), as plain host functions that
// every build compiles, GPU or not.
//
// Note [CUDA launch configurations]
// - A launcher in kernels/cuda/ takes <<<grid, block, dynamic shared
//   memory>>> from one of these functions only (launch_kernel() in
//   kernels/cuda/launch.cuh), and asks for more than the default 48 KiB of
//   dynamic shared memory exactly where its configuration needs it.
// - CTest gpu_launch_limits (tests/test_gpu_launch_limits.cc) computes the
//   configuration of every kernel for every shape the models accept and the
//   GPU tests use, and checks it against sm_80's and sm_90's limits, on a
//   machine without a GPU.
// - Static shared memory is each kernel's declared upper bound
//   (LaunchConfig::static_smem_bytes). A CUDA build checks it, and the
//   registers of the widest block a kernel is launched with, against
//   ptxas' report of the kernel (CTest ptxas_launch_resources), and fails
//   on a kernel that no function here names.
// - Constants a kernel's indexing depends on (threads per block, rows per
//   block, tile widths) are defined here once, for the kernel and the
//   configuration alike.
#pragma once

#include <cstdint>

namespace mp {

struct LaunchDims {
  int64_t x = 1, y = 1, z = 1;
};

struct LaunchConfig {
  const char* kernel = "";  // the __global__ function's name, as in its source
  LaunchDims grid, block;
  int64_t dynamic_smem_bytes = 0;
  int64_t static_smem_bytes = 0;  // at most; ptxas' report is checked against it
  int64_t threads() const { return block.x * block.y * block.z; }
};

inline constexpr int64_t kDefaultSmemBytes = 48 * 1024;  // without the opt-in attribute
// Whether the launcher must raise the kernel's dynamic shared memory limit first.
inline bool needs_smem_optin(const LaunchConfig& c) {
  return c.dynamic_smem_bytes + c.static_smem_bytes > kDefaultSmemBytes;
}

namespace cuda_launch {

inline constexpr int kThreads = 256;  // the element-wise kernels' block
inline constexpr int kWarp = 32;

// A grid-stride loop over `work` items: ceil(work / threads) blocks, at least
// one and at most max_blocks.
LaunchConfig grid_stride(const char* kernel, int64_t work, int64_t max_blocks = 65535, int threads = kThreads);

// ---- LayerNorm (kernels/cuda/layernorm_cuda.cu) ----------------------------------
inline constexpr int kLnWarps = 8;  // per block
inline constexpr int kLnThreads = kLnWarps * kWarp;
inline constexpr int kLnVec = 8;                       // channels per lane per step
inline constexpr int kLnTile = kWarp * kLnVec;         // backward: channels per column tile
inline constexpr int64_t kLnMinRowsPerBlock = 32;      // backward
inline constexpr int64_t kLnMaxBackwardBlocks = 1024;  // backward: partial rows at most
inline constexpr int kLnSumColumns = 32;               // backward's column sum: columns per block
inline constexpr int kLnSumSlices = 8;                 // and row slices per block
// Rows one backward block takes: at least kLnMinRowsPerBlock, and so many that
// at most kLnMaxBackwardBlocks blocks (the partial rows) cover `rows`.
int64_t layernorm_backward_rows_per_block(int64_t rows);
LaunchConfig layernorm_forward(int64_t rows);
LaunchConfig layernorm_backward(int64_t rows);
LaunchConfig layernorm_backward_sum(int64_t channels);

// ---- GPT element ops (kernels/cuda/gpt_ops_cuda.cu) ------------------------------
inline constexpr int64_t kColumnMinRowsPerChunk = 64;  // column sums: rows per partial
inline constexpr int64_t kColumnMaxChunks = 4096;
struct ColumnChunks {
  int64_t rows_per_chunk, chunks;
};
ColumnChunks column_chunks(int64_t rows);
LaunchConfig column_partials(int64_t rows, int64_t cols);
LaunchConfig embedding_wte_backward(int64_t rows, int64_t channels);
inline constexpr int kXentThreads = 512;
LaunchConfig softmax_xent(int64_t rows);
LaunchConfig mean_loss();

// ---- the classifier (kernels/cuda/classifier_cuda.cu) ----------------------------
inline constexpr int kClassifierThreads = 1024;
LaunchConfig classifier(int64_t rows);

// ---- flash attention, fp32 (kernels/cuda/flash_attention.cu) ---------------------
inline constexpr int kFlashRows = 4;   // warps per block: query rows (forward, dq) or key rows (dk, dv)
inline constexpr int kFlashTile = 32;  // keys (or queries) staged per round: one per lane
inline constexpr int kFlashDeltaThreads = 256;
LaunchConfig flash_forward(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim);
LaunchConfig flash_dq(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim);
LaunchConfig flash_dkv(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim);
LaunchConfig flash_delta(int64_t rows, int64_t heads);

// ---- gradient statistics (kernels/cuda/grad_stats.cu) ----------------------------
inline constexpr int64_t kGradStatsMaxBlocks = 1024;
LaunchConfig grad_stats_partials(int64_t n);
LaunchConfig grad_stats_finish();

// The fused update (kernels/cuda/update.cu): `work` packs or elements.
LaunchConfig update(int64_t work);
// The deliberate device fault (kernels/cuda/ops.cu): one thread.
LaunchConfig device_fault();

}  // namespace cuda_launch
}  // namespace mp

// tests/test_gpu_launch_limits.cc: CTest gpu_launch_limits. The launch
// configuration of every CUDA kernel mp launches (kernels/cuda_launch.h,
// the functions its launchers call) and of the GPU tests' own reference
// kernels (tests/gpu/gpu_shapes.h) at every shape the GPT takes, from
// GPT-2 124M to widths of 8192 channels, B 1 to 64, T 64 to 2048, and at
// every shape the GPU tests use (tests/gpu/gpu_shapes.h), checked against
// sm_80's and sm_90's limits. Runs on every build, GPU or not.
//
//   mp_gpu_launch_limits [gtest flags]   the test
//   mp_gpu_launch_limits --table         per kernel, the widest block, most
//                                        dynamic and declared static shared memory it is launched with, a line each
//                                        (CTest ptxas_launch_resources checks ptxas' report against it)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda_launch.h"
#include "tests/gpu/gpu_shapes.h"

namespace mp {
namespace {

namespace cl = cuda_launch;

using detail::str;

// What a launch may ask of one architecture (CUDA C++ Programming Guide,
// technical specifications per compute capability).
struct ArchLimits {
  const char* name;
  int64_t smem_optin_bytes;  // static + dynamic per block, with the opt-in
};
constexpr int64_t kMaxThreadsPerBlock = 1024;
constexpr ArchLimits kSm80{"sm_80", 166912};
constexpr ArchLimits kSm90{"sm_90", 232448};

// "" when `c` launches on `arch`, else every limit it passes, named.
std::string launch_problem(const LaunchConfig& c, const ArchLimits& arch) {
  std::string out;
  const auto add = [&](const std::string& s) { out += (out.empty() ? "" : "; ") + s; };
  const LaunchDims g = c.grid, b = c.block;
  if (g.x < 1 || g.y < 1 || g.z < 1) add(str("grid ", g.x, " x ", g.y, " x ", g.z, " has an empty dimension"));
  if (g.x > 2147483647 || g.y > 65535 || g.z > 65535)
    add(str("grid ", g.x, " x ", g.y, " x ", g.z, " > 2^31-1 x 65535 x 65535"));
  if (b.x < 1 || b.y < 1 || b.z < 1 || b.x > 1024 || b.y > 1024 || b.z > 64) {
    add(str("block ", b.x, " x ", b.y, " x ", b.z, " outside 1..1024 x 1..1024 x 1..64"));
  }
  if (c.threads() > kMaxThreadsPerBlock) add(str(c.threads(), " threads per block > ", kMaxThreadsPerBlock));
  if (c.static_smem_bytes > kDefaultSmemBytes) {
    add(str(c.static_smem_bytes, " B of static shared memory > ", kDefaultSmemBytes));
  }
  if (c.dynamic_smem_bytes < 0) add(str(c.dynamic_smem_bytes, " B of dynamic shared memory"));
  const int64_t smem = c.dynamic_smem_bytes + c.static_smem_bytes;
  if (smem > arch.smem_optin_bytes) {
    add(str(smem, " B of shared memory (", c.dynamic_smem_bytes, " dynamic + ", c.static_smem_bytes, " static) > ",
            arch.name, "'s ", arch.smem_optin_bytes));
  }
  return out.empty() ? out : str(c.kernel, " on ", arch.name, ": ", out);
}

struct GptShape {
  const char* name;
  int64_t channels, heads;
};
// GPT-2 124M, 350M, 774M, 1.5B, and wider models up to Llama-70B's width.
constexpr GptShape kGpts[] = {{"gpt2-124m", 768, 12},  {"gpt2-350m", 1024, 16}, {"gpt2-774m", 1280, 20},
                              {"gpt2-1.5b", 1600, 25}, {"2048", 2048, 16},      {"4096", 4096, 32},
                              {"5120", 5120, 40},      {"8192", 8192, 64}};
constexpr int64_t kBatches[] = {1, 2, 4, 8, 16, 32, 64};
constexpr int64_t kSeqs[] = {64, 128, 256, 512, 1024, 2048};
constexpr int64_t kPaddedVocab = 50304;

// The grid-stride kernels (cuda_launch::grid_stride, kThreads threads):
// any amount of work fits; named here for the table.
constexpr const char* kGridStrideKernels[] = {"accumulate_f64_kernel",
                                              "accumulate_kernel",
                                              "accumulate_rank_chunks_kernel",
                                              "apply_master_kernel",
                                              "apply_remainder_kernel",
                                              "column_finish_kernel",
                                              "combine_b_kernel",
                                              "combine_x_kernel",
                                              "convert_elements_kernel",
                                              "convert_kernel",
                                              "embedding_forward_kernel",
                                              "embedding_forward_vec_kernel",
                                              "embedding_keys_kernel",
                                              "embedding_wpe_backward_kernel",
                                              "epilogue_kernel",
                                              "fill_u16_kernel",
                                              "fill_u32_kernel",
                                              "load_kernel",
                                              "momentum_kernel",
                                              "pack_fp32_kernel",
                                              "round_f64_kernel",
                                              "round_through_kernel",
                                              "scale_kernel",
                                              "store_kernel",
                                              "tanh_backward_kernel",
                                              "tanh_forward_kernel",
                                              "widen_ranges_kernel"};

// Every configuration the launchers compute for one model shape and batch.
std::vector<LaunchConfig> gpt_step_launches(int64_t batch, int64_t seq, int64_t channels, int64_t heads) {
  const int64_t rows = batch * seq, hd = channels / heads;
  std::vector<LaunchConfig> out = {
      cl::layernorm_forward(rows),
      cl::layernorm_backward(rows),
      cl::layernorm_backward_sum(channels),
      cl::classifier(rows),
      cl::softmax_xent(rows),
      cl::mean_loss(),
      cl::embedding_wte_backward(rows, channels),
      cl::flash_forward(batch, seq, heads, hd),
      cl::flash_dq(batch, seq, heads, hd),
      cl::flash_dkv(batch, seq, heads, hd),
      cl::flash_delta(rows, heads),
      gpu_shapes::attention_rows("attention_forward_kernel", batch, seq, channels, heads),
      gpu_shapes::attention_rows("attention_dscore_kernel", batch, seq, channels, heads),
      gpu_shapes::attention_dqkv(batch, seq, channels, heads),
      cl::grad_stats_partials(rows * channels),
      cl::grad_stats_finish(),
      cl::update(rows * channels),
      cl::device_fault(),
  };
  // Bias gradients: the GPT's own column sums and the GEMM's fallback's.
  for (const int64_t cols : {3 * channels, channels, 4 * channels, kPaddedVocab}) {
    out.push_back(cl::column_partials(rows, cols));
  }
  for (const char* k : kGridStrideKernels) out.push_back(cl::grid_stride(k, rows * kPaddedVocab));
  return out;
}

// The GPU tests' shapes.
std::vector<LaunchConfig> gpu_test_launches() {
  std::vector<LaunchConfig> out;
  for (const auto& [rows, channels] : gpu_shapes::kLayerNorm) {
    for (const LaunchConfig& c :
         {cl::layernorm_forward(rows), cl::layernorm_backward(rows), cl::layernorm_backward_sum(channels)}) {
      out.push_back(c);
    }
  }
  for (const auto& [rows, vocab, padded] : gpu_shapes::kClassifier) {
    out.push_back(cl::classifier(rows));
    out.push_back(cl::softmax_xent(rows));
  }
  for (const auto& s : gpu_shapes::kReferenceAttention) {
    out.push_back(gpu_shapes::attention_rows("attention_forward_kernel", s.batch, s.seq, s.channels, s.heads));
    out.push_back(gpu_shapes::attention_rows("attention_dscore_kernel", s.batch, s.seq, s.channels, s.heads));
    out.push_back(gpu_shapes::attention_dqkv(s.batch, s.seq, s.channels, s.heads));
  }
  for (const auto& s : gpu_shapes::kFlashAttention) {
    const int64_t hd = s.channels / s.heads;
    for (const LaunchConfig& c :
         {cl::flash_forward(s.batch, s.seq, s.heads, hd), cl::flash_dq(s.batch, s.seq, s.heads, hd),
          cl::flash_dkv(s.batch, s.seq, s.heads, hd), cl::flash_delta(s.batch * s.seq, s.heads)}) {
      out.push_back(c);
    }
  }
  return out;
}

std::vector<LaunchConfig> every_launch() {
  std::vector<LaunchConfig> all = gpu_test_launches();
  for (const GptShape& g : kGpts) {
    for (const int64_t b : kBatches) {
      for (const int64_t t : kSeqs) {
        for (const LaunchConfig& c : gpt_step_launches(b, t, g.channels, g.heads)) all.push_back(c);
      }
    }
  }
  // Work of no element to more than fits a grid.
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{1} << 40}) {
    all.push_back(cl::grid_stride("convert_kernel", n));
    all.push_back(cl::grad_stats_partials(n));
    all.push_back(cl::update(n));
  }
  return all;
}

TEST(GpuLaunchLimits, EveryKernelAtEveryModelAndTestShapeFitsSm80AndSm90) {
  const std::vector<LaunchConfig> all = every_launch();
  int failures = 0;
  for (const ArchLimits& arch : {kSm80, kSm90}) {
    for (const LaunchConfig& c : all) {
      const std::string problem = launch_problem(c, arch);
      if (!problem.empty() && ++failures <= 20) ADD_FAILURE() << problem;
    }
  }
  EXPECT_EQ(failures, 0) << "launches over a limit (the first 20 are named above), of " << all.size() << " checked";
}

TEST(GpuLaunchLimits, LayerNormBackwardSharedMemoryDoesNotGrowWithWidth) {
  // Any width the GPT config accepts runs: the backward's shared memory is
  // the same at 8 channels as at 2^24.
  for (const int64_t rows : {int64_t{1}, int64_t{65536}, int64_t{1} << 30}) {
    const LaunchConfig c = cl::layernorm_backward(rows);
    EXPECT_LE(c.dynamic_smem_bytes + c.static_smem_bytes, kDefaultSmemBytes);
    EXPECT_LE(c.grid.x, cl::kLnMaxBackwardBlocks) << rows << " rows";
    EXPECT_GE(c.grid.x * cl::layernorm_backward_rows_per_block(rows), rows) << rows << " rows";
  }
  EXPECT_EQ(launch_problem(cl::layernorm_backward_sum(int64_t{1} << 24), kSm80), "");
}

TEST(GpuLaunchLimits, ProblemsAreNamed) {
  LaunchConfig c = cl::layernorm_backward(100);
  c.dynamic_smem_bytes = 458752;  // the request of a backward that kept a row per warp at 7168 channels
  const std::string problem = launch_problem(c, kSm90);
  EXPECT_NE(problem.find("layernorm_backward_kernel on sm_90"), std::string::npos) << problem;
  EXPECT_NE(problem.find("> sm_90's 232448"), std::string::npos) << problem;
  c = cl::grid_stride("convert_kernel", 10);
  c.block.x = 2048;
  EXPECT_NE(launch_problem(c, kSm80).find("2048 threads per block > 1024"), std::string::npos);
  c = cl::grid_stride("convert_kernel", 10);
  c.grid.y = 70000;
  EXPECT_NE(launch_problem(c, kSm80).find("grid 1 x 70000 x 1"), std::string::npos);
}

// --table: "kernel threads dynamic_bytes static_bytes", the largest of each over every launch.
int print_table() {
  std::map<std::string, LaunchConfig> widest;
  for (const LaunchConfig& c : every_launch()) {
    LaunchConfig& w = widest.try_emplace(c.kernel, c).first->second;
    if (c.threads() > w.threads()) w.block = c.block;
    w.dynamic_smem_bytes = std::max(w.dynamic_smem_bytes, c.dynamic_smem_bytes);
    w.static_smem_bytes = std::max(w.static_smem_bytes, c.static_smem_bytes);
  }
  for (const auto& [name, c] : widest) {
    std::printf("%s %lld %lld %lld\n", name.c_str(), static_cast<long long>(c.threads()),
                static_cast<long long>(c.dynamic_smem_bytes), static_cast<long long>(c.static_smem_bytes));
  }
  return 0;
}

}  // namespace
}  // namespace mp

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--table") == 0) return mp::print_table();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

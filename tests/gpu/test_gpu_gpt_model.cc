// GPU tests (label "gpu") of the GPT on CUDA (models/gpt.h) and its flash
// attention kernels (kernels/cuda/flash_attention_cuda.h):
// - the flash kernels against the probability-keeping reference kernel
//   (itself checked against the CPU op in double, test_gpu_gpt_ops.cc) on
//   head sizes 8 .. 128 and sequence lengths that are not multiples of the
//   tile, forward and backward, and bitwise repeatable;
// - the GPT on the GPU against the same GPT on the CPU on the same
//   parameters and micro-batch: the loss, every unit's gradients and a
//   kept logits row, with fp32 and with bf16 GEMM inputs, the loss in
//   several chunks; its workspace is what activation_bytes() says (the
//   memory plan's activations);
// - bf16 parameters give the same bits as fp32 parameters holding the same
//   values, and a second run gives the same bits as the first.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_stream.h"
#include "core/error_cuda.h"
#include "core/pinned.h"
#include "core/tensor.h"
#include "kernels/convert_math.h"
#include "kernels/cuda/flash_attention_cuda.h"
#include "models/flat_layout.h"
#include "models/gpt.h"
#include "tests/gpu/gpu_shapes.h"
#include "tests/gpu/gpu_test.h"
#include "tests/gpu/reference_attention.h"

namespace mp {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

template <class T>
T* to_device(const std::vector<T>& host) {
  void* p = nullptr;
  MP_CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(host.size(), 1) * sizeof(T)));
  MP_CHECK_CUDA(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return static_cast<T*>(p);
}

template <class T>
std::vector<T> to_host(const T* p, size_t n) {
  testing::wait_for_stream(nullptr);  // the kernels ran on the legacy default stream (bounded wait)
  std::vector<T> out(n);
  MP_CHECK_CUDA(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

// max |a - b| / max(max |b|, floor): one number per tensor.
double rel_err(const std::vector<float>& a, const std::vector<float>& b, double floor = 1e-6) {
  double diff = 0.0, scale = floor;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// ---- flash attention ------------------------------------------------------------

using AttentionCase = gpu_shapes::Attention;

class GpuFlashAttention : public testing::GpuTest, public ::testing::WithParamInterface<AttentionCase> {};

// An attention's outputs on the host: out [rows, C] and dqkv [rows, 3C].
struct AttentionResult {
  std::vector<float> out, dqkv;
};

// Random qkv and dout for `c` (seeded), on the device.
struct AttentionInputs {
  int64_t nc;
  float *qkv, *dout;
  AttentionInputs(const AttentionCase& c, uint32_t seed) : nc(c.batch * c.seq * c.channels) {
    qkv = to_device(random_floats(static_cast<size_t>(3 * nc), seed, 1.0f));
    dout = to_device(random_floats(static_cast<size_t>(nc), seed + 1, 1.0f));
  }
  ~AttentionInputs() {
    cudaFree(qkv);
    cudaFree(dout);
  }
};

// The probability-keeping reference kernels.
AttentionResult reference(const AttentionCase& c, const AttentionInputs& in) {
  float* att = to_device(std::vector<float>(static_cast<size_t>(c.batch * c.heads * c.seq * c.seq)));
  float* out = to_device(std::vector<float>(static_cast<size_t>(in.nc)));
  float* dqkv = to_device(std::vector<float>(static_cast<size_t>(3 * in.nc)));
  float* scratch = to_device(
      std::vector<float>(static_cast<size_t>(gpt_attention_backward_cuda_scratch_elements(c.batch, c.seq, c.heads))));
  gpt_attention_forward_cuda(in.qkv, c.batch, c.seq, c.channels, c.heads, att, out, nullptr);
  gpt_attention_backward_cuda(in.qkv, att, in.dout, c.batch, c.seq, c.channels, c.heads, scratch, dqkv, nullptr);
  AttentionResult r{to_host(out, static_cast<size_t>(in.nc)), to_host(dqkv, static_cast<size_t>(3 * in.nc))};
  for (float* p : {att, out, dqkv, scratch}) cudaFree(p);
  return r;
}

// A flash variant (forward, backward) into outputs that start as NaN, so an
// element never written fails every comparison.
template <class Forward, class Backward>
AttentionResult flash(const AttentionCase& c, const AttentionInputs& in, Forward forward, Backward backward) {
  float* out = to_device(std::vector<float>(static_cast<size_t>(in.nc), NAN));
  float* lse = to_device(std::vector<float>(static_cast<size_t>(c.batch * c.heads * c.seq)));
  float* dqkv = to_device(std::vector<float>(static_cast<size_t>(3 * in.nc), NAN));
  float* scratch = to_device(
      std::vector<float>(static_cast<size_t>(flash_attention_backward_scratch_elements(c.batch, c.seq, c.heads))));
  forward(in.qkv, c.batch, c.seq, c.channels, c.heads, out, lse, nullptr);
  backward(in.qkv, out, lse, in.dout, c.batch, c.seq, c.channels, c.heads, scratch, dqkv, nullptr);
  AttentionResult r{to_host(out, static_cast<size_t>(in.nc)), to_host(dqkv, static_cast<size_t>(3 * in.nc))};
  for (float* p : {out, lse, dqkv, scratch}) cudaFree(p);
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_P(GpuFlashAttention, MatchesTheReferenceKernelAndRepeats) {
  const AttentionCase c = GetParam();
  const AttentionInputs in(c, 1);
  const AttentionResult want = reference(c, in);
  const AttentionResult a = flash(c, in, flash_attention_forward_cuda, flash_attention_backward_cuda);
  const AttentionResult again = flash(c, in, flash_attention_forward_cuda, flash_attention_backward_cuda);
  EXPECT_LT(rel_err(a.out, want.out), 2e-5);  // NaN fails too
  EXPECT_LT(rel_err(a.dqkv, want.dqkv), 1e-4);
  EXPECT_TRUE(same_bits(a.out, again.out)) << "forward not repeatable";
  EXPECT_TRUE(same_bits(a.dqkv, again.dqkv)) << "backward not repeatable";
}


INSTANTIATE_TEST_SUITE_P(Shapes, GpuFlashAttention, ::testing::ValuesIn(gpu_shapes::kFlashAttention));

// ---- the model --------------------------------------------------------------------

GptConfig small_gpt(DType matmul) {
  GptConfig c;
  c.vocab = 70;  // padded to 128
  c.context = 40;
  c.channels = 64;
  c.heads = 2;  // head size 32
  c.layers = 2;
  c.micro_batch_size = 3;
  c.matmul_dtype = matmul;
  c.threads = 1;
  return c;
}

struct Pass {
  double loss = 0.0;
  std::vector<std::vector<float>> grads;  // per unit, numel elements
  std::vector<float> kept;                // logits row kKeptRow
};

constexpr int64_t kKeptRow = 45;

std::vector<std::vector<float>> unit_params(const GptConfig& c, bool round_to_bf16) {
  const FlatLayout layout(Gpt::spec_for(c), 1);
  std::vector<std::vector<float>> params;
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<float> p = random_floats(static_cast<size_t>(layout.unit(u).numel), 100 + u, 0.2f);
    if (round_to_bf16) {
      for (float& x : p) x = math::to_f32(math::from_f32<bf16>(x));
    }
    params.push_back(std::move(p));
  }
  return params;
}

Pass host_pass(const GptConfig& c, const std::vector<std::vector<float>>& params) {
  Gpt gpt(c);
  Pass pass;
  gpt.keep_logits_row(kKeptRow);
  gpt.begin_micro_batch(3);
  for (size_t u = 0; u < params.size(); ++u) {
    gpt.forward(static_cast<int>(u), Tensor::wrap(const_cast<float*>(params[u].data()), Device::cpu(), DType::kF32,
                                                  {static_cast<int64_t>(params[u].size())}));
  }
  pass.loss = gpt.loss();
  pass.kept = gpt.kept_logits();
  pass.grads.resize(params.size());
  for (size_t u = params.size(); u-- > 0;) {
    pass.grads[u].assign(params[u].size(), 0.0f);
    const auto n = static_cast<int64_t>(params[u].size());
    gpt.backward(static_cast<int>(u), Tensor::wrap(const_cast<float*>(params[u].data()), Device::cpu(), DType::kF32, {n}),
                 Tensor::wrap(pass.grads[u].data(), Device::cpu(), DType::kF32, {n}));
  }
  return pass;
}

// The same GPT on the GPU, through the Model calls on a stream as the
// engine makes them; the loss comes back into a pinned slot.
Pass device_pass(const GptConfig& c, const std::vector<std::vector<float>>& params, DType param_dtype,
                 int64_t chunk_rows) {
  const Device dev = Device::cuda(0);
  Allocator alloc(dev);
  CudaStream stream(dev, "gpt test");
  GptOptions o;
  o.loss_chunk_rows = chunk_rows;
  Gpt gpt(c, alloc, nullptr, o);
  std::vector<Tensor> p, g;
  for (const auto& host : params) {
    const auto n = static_cast<int64_t>(host.size());
    Tensor t = Tensor::empty(alloc, param_dtype, {n}, MemCategory::kOther);
    if (param_dtype == DType::kF32) {
      testing::copy_on_stream(t.data(), host.data(), host.size() * 4, stream.handle());
    } else {
      std::vector<bf16> narrow(host.size());
      for (size_t i = 0; i < host.size(); ++i) narrow[i] = math::from_f32<bf16>(host[i]);
      testing::copy_on_stream(t.data(), narrow.data(), narrow.size() * 2, stream.handle());
    }
    p.push_back(std::move(t));
    g.push_back(Tensor::empty(alloc, DType::kF32, {n}, MemCategory::kOther));
  }
  PinnedBuffer loss(dev, sizeof(double));
  gpt.keep_logits_row(kKeptRow);
  gpt.begin_micro_batch_on(3, stream);
  for (size_t u = 0; u < p.size(); ++u) gpt.forward_on(static_cast<int>(u), p[u], stream);
  gpt.loss_on(loss.as<double>(), stream);
  for (size_t u = p.size(); u-- > 0;) gpt.backward_on(static_cast<int>(u), p[u], g[u], stream);
  stream.synchronize();
  Pass pass;
  pass.loss = *loss.as<double>();
  pass.kept = gpt.kept_logits();
  for (const Tensor& t : g) {
    std::vector<float> host(static_cast<size_t>(t.numel()));
    testing::copy_on_stream(host.data(), t.data(), host.size() * 4, stream.handle());
    pass.grads.push_back(std::move(host));
  }
  return pass;
}

class GpuGptModel : public testing::GpuTest {};

void expect_close(const Pass& gpu, const Pass& cpu, double loss_tol, double grad_tol) {
  EXPECT_NEAR(gpu.loss, cpu.loss, loss_tol * std::abs(cpu.loss));
  EXPECT_LT(rel_err(gpu.kept, cpu.kept), grad_tol) << "kept logits row";
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t u = 0; u < cpu.grads.size(); ++u) {
    EXPECT_LT(rel_err(gpu.grads[u], cpu.grads[u]), grad_tol) << "unit " << u;
  }
}

TEST_F(GpuGptModel, Fp32MatchesTheHostModelWithTheLossInChunks) {
  const GptConfig c = small_gpt(DType::kF32);
  const auto params = unit_params(c, false);
  const Pass cpu = host_pass(c, params);
  for (int64_t chunk : {int64_t{0}, int64_t{7}, int64_t{64}}) {
    SCOPED_TRACE(chunk);
    expect_close(device_pass(c, params, DType::kF32, chunk), cpu, 1e-5, 1e-4);
  }
}

// An odd width: the MLP's GELU by its kernels (the GEMM epilogue needs a
// row stride 4 C that is a multiple of 8), head size 21.
TEST_F(GpuGptModel, OddWidthMatchesTheHostModel) {
  GptConfig c = small_gpt(DType::kF32);
  c.channels = 63;
  c.heads = 3;
  const auto params = unit_params(c, false);
  expect_close(device_pass(c, params, DType::kF32, 0), host_pass(c, params), 1e-5, 1e-4);
}

TEST_F(GpuGptModel, Bf16GemmsMatchTheHostModel) {
  const GptConfig c = small_gpt(DType::kBF16);
  const auto params = unit_params(c, false);
  // bf16 rounding of inputs that differ in the last fp32 bits can move a
  // value by one bf16 step (2^-8 relative): a looser bound.
  expect_close(device_pass(c, params, DType::kF32, 16), host_pass(c, params), 2e-3, 3e-2);
}

// Head size 64: cuDNN's fused attention where this build and device have it.
TEST_F(GpuGptModel, CudnnAttentionMatchesTheHostModelWithinBf16) {
  GptConfig c = small_gpt(DType::kBF16);
  c.channels = 128;
  {
    Allocator alloc(Device::cuda(0));
    const Gpt probe(c, alloc);
    if (!probe.cudnn_attention(0)) GTEST_SKIP() << probe.describe_kernels();
  }
  const auto params = unit_params(c, false);
  expect_close(device_pass(c, params, DType::kF32, 0), host_pass(c, params), 5e-3, 5e-2);
}

TEST_F(GpuGptModel, Bf16ParametersGiveTheBitsOfTheirFp32ValuesAndRunsRepeat) {
  const GptConfig c = small_gpt(DType::kBF16);
  const auto params = unit_params(c, true);
  const Pass a = device_pass(c, params, DType::kBF16, 16);
  const Pass b = device_pass(c, params, DType::kF32, 16);
  const Pass again = device_pass(c, params, DType::kBF16, 16);
  for (const Pass* other : {&b, &again}) {
    EXPECT_EQ(a.loss, other->loss);
    for (size_t u = 0; u < a.grads.size(); ++u) {
      EXPECT_EQ(std::memcmp(a.grads[u].data(), other->grads[u].data(), a.grads[u].size() * 4), 0) << "unit " << u;
    }
  }
}

TEST_F(GpuGptModel, ActivationBytesAreWhatTheModelAllocates) {
  for (DType matmul : {DType::kF32, DType::kBF16}) {
    const GptConfig c = small_gpt(matmul);
    Allocator alloc(Device::cuda(0));
    const Gpt gpt(c, alloc);
    EXPECT_EQ(static_cast<int64_t>(alloc.stats().current_bytes[static_cast<size_t>(MemCategory::kActivations)]),
              Gpt::activation_bytes(c, Device::cuda(0)));
  }
}

}  // namespace
}  // namespace mp

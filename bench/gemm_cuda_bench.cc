// bench/gemm_cuda_bench.cc: suite "gemm_cuda": every GEMM of a GPT-2 124M
// training step (C = 768, 4C = 3072, vocabulary padded to Vp = 50304,
// T = 1024) through gemm_cuda (kernels/cuda/gemm_cublaslt.h) at rows
// R = B T for each batch B of --sizes (default 4 and 16), each problem
// exactly as the bf16 recipes run it (models/gpt.cc block_forward,
// block_backward, head_chunk; kernels/nn/gemm.cc):
//   c_attn_fwd        qkv [R, 3C] bf16 = ln_1 [R, C] w [C, 3C] + bias
//   attn_proj_fwd     res2 [R, C] fp32 = atty w [C, C] + bias + x (addend)
//   fc_fwd_gelu       fch_gelu [R, 4C] bf16 = gelu(ln_2 w + bias), fch (aux) bf16
//   mlp_proj_fwd      out [R, C] fp32 = fch_gelu w [4C, C] + bias + res2 (addend)
//   mlp_proj_dx_dgelu dfch [R, 4C] bf16 = (dres w^T) gelu'(fch)
//   fc_dx             dln_2 [R, C] bf16 = dfch w^T
//   attn_proj_dx      datty [R, C] bf16 = dres w^T
//   c_attn_dx         dln_1 [R, C] bf16 = dqkv w^T
//   mlp_proj_dw, fc_dw, attn_proj_dw, c_attn_dw
//                     dw [in, out] fp32 = x^T dy, with the bias gradient
//   logits            [R, Vp] bf16 = ln_f wte^T
//   head_dlnf         dln_f [R, C] bf16 = dlogits wte
//   head_dwte         dwte [Vp, C] fp32 = dlogits^T ln_f
// All inputs bf16 (bias and addend fp32), random and non-zero (timings on
// zeros can flatter). Each case is timed twice, in alternating rounds: as
// the model runs it (value), and as the same product with a plain fp32
// output and no epilogue ("plain": how each GEMM ran before its bias,
// GELU, residual add and cast moved into the GEMM, without the separate
// kernels those took). The reference, measured in the same run: the bf16
// GEMM peak of this cuBLASLt, C [8192, 8192] bf16 = A B, bf16 inputs, fp32
// accumulation. value = TFLOP/s (2 m n k over the median time), ref =
// peak_8192_bf16, ratio = value / ref; beside it the plain product's
// TFLOP/s, the speed-up over it, and the plan gemm_cuda made (its form,
// cuBLASLt's algorithm id and how many candidates it timed:
// gemm_cuda_new_plans()). A row step_gemms_b<B> sums one training step's
// GEMMs (12 layers' twelve, the head's three): milliseconds and TFLOP/s.
//
// Timing: CUDA events around a group of kGroup back-to-back calls (the GPU
// does not wait for the host's enqueue, as in training, where the host runs
// ahead), the median over --iters groups after --warmup; enqueue_us is the
// host's time per call: a GEMM shorter than that is host-bound here. Every
// host wait is bounded (core/host_wait.h). Without a device the suite
// throws ConfigError saying why. Run with launch/mprun -np 1.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/suites.h"
#include "core/cuda_stream.h"
#include "core/device.h"
#include "core/error.h"
#include "core/error_cuda.h"
#include "core/host_wait.h"
#include "kernels/convert_math.h"
#include "kernels/cuda/gemm_cublaslt.h"

namespace mp::bench {
namespace {

constexpr int64_t kC = 768, kVp = 50304, kT = 1024, kLayers = 12;
constexpr int kGroup = 10;  // calls between two events

// Device memory freed at scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { MP_CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 1))); }
  ~DeviceBuffer() { (void)cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Random non-zero values (bf16 and fp32, |x| in [0.25, 1]), made once on
// the host and tiled over each buffer on the device.
class Filler {
 public:
  explicit Filler(cudaStream_t stream) : stream_(stream), bf16_(kBlockBytes), f32_(kBlockBytes) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(0.25f, 1.0f);
    auto value = [&] { return rng() % 2 == 0 ? u(rng) : -u(rng); };
    std::vector<uint16_t> h16(kBlockBytes / 2);
    for (uint16_t& x : h16) x = math::f32_to_bf16_bits(value());
    upload(bf16_.p, h16.data());
    std::vector<float> h32(kBlockBytes / 4);
    for (float& x : h32) x = value();
    upload(f32_.p, h32.data());
  }

  // `bytes` of `p` (a device buffer) from the random block of `dtype`.
  void fill(void* p, size_t bytes, DType dtype) const {
    const void* src = dtype == DType::kBF16 ? bf16_.p : f32_.p;
    auto* dst = static_cast<char*>(p);
    for (size_t at = 0; at < bytes; at += kBlockBytes) {
      MP_CHECK_CUDA(
          cudaMemcpyAsync(dst + at, src, std::min(kBlockBytes, bytes - at), cudaMemcpyDeviceToDevice, stream_));
    }
    synchronize_stream(stream_, kDefaultWaitTimeout, "a fill of the gemm_cuda benchmark");
  }

 private:
  static constexpr size_t kBlockBytes = size_t{8} << 20;
  // A copy from pageable memory on the legacy default stream, then a bounded
  // wait for it (no stream copy from pageable memory).
  static void upload(void* dst, const void* src) {
    MP_CHECK_CUDA(cudaMemcpy(dst, src, kBlockBytes, cudaMemcpyHostToDevice));
    synchronize_stream(nullptr, kDefaultWaitTimeout, "the legacy default stream (the gemm_cuda benchmark's data)");
  }

  cudaStream_t stream_;
  DeviceBuffer bf16_, f32_;
};

// One GEMM of the step, as the model describes it.
struct Case {
  const char* name;
  int64_t m, n, k;
  bool a_t, b_t;      // operands stored transposed
  int64_t lda, ldb;   // leading dimensions as stored
  DType c_dtype;      // C as the model stores it
  bool bias, addend;  // fp32 bias [n]; fp32 addend [m, n]
  GemmEpilogue epilogue;
  bool bias_grad;  // fp32 [n]
  int per_step;    // how many times a step runs it
};

// The step's GEMMs at R rows (the header comment; kernels/nn/gemm.cc's
// linear_forward, linear_backward_input and linear_backward_weight).
std::vector<Case> step_cases(int64_t r) {
  const int64_t c = kC, c3 = 3 * kC, c4 = 4 * kC;
  const auto none = GemmEpilogue::kNone;
  const int l = static_cast<int>(kLayers);
  return {
      {"c_attn_fwd", r, c3, c, false, false, c, c3, DType::kBF16, true, false, none, false, l},
      {"attn_proj_fwd", r, c, c, false, false, c, c, DType::kF32, true, true, none, false, l},
      {"fc_fwd_gelu", r, c4, c, false, false, c, c4, DType::kBF16, true, false, GemmEpilogue::kGelu, false, l},
      {"mlp_proj_fwd", r, c, c4, false, false, c4, c, DType::kF32, true, true, none, false, l},
      {"mlp_proj_dx_dgelu", r, c4, c, false, true, c, c, DType::kBF16, false, false, GemmEpilogue::kDGelu, false, l},
      {"fc_dx", r, c, c4, false, true, c4, c4, DType::kBF16, false, false, none, false, l},
      {"attn_proj_dx", r, c, c, false, true, c, c, DType::kBF16, false, false, none, false, l},
      {"c_attn_dx", r, c, c3, false, true, c3, c3, DType::kBF16, false, false, none, false, l},
      {"mlp_proj_dw", c4, c, r, true, false, c4, c, DType::kF32, false, false, none, true, l},
      {"fc_dw", c, c4, r, true, false, c, c4, DType::kF32, false, false, none, true, l},
      {"attn_proj_dw", c, c, r, true, false, c, c, DType::kF32, false, false, none, true, l},
      {"c_attn_dw", c, c3, r, true, false, c, c3, DType::kF32, false, false, none, true, l},
      {"logits", r, kVp, c, false, true, c, c, DType::kBF16, false, false, none, false, 1},
      {"head_dlnf", r, c, kVp, false, false, kVp, c, DType::kBF16, false, false, none, false, 1},
      {"head_dwte", kVp, c, r, true, false, kVp, c, DType::kF32, false, false, none, false, 1},
  };
}

size_t stored_elements(int64_t rows, int64_t cols, bool transposed, int64_t ld) {
  return static_cast<size_t>((transposed ? cols : rows) * ld);
}

// A case's buffers, filled, and its two problems.
struct Operands {
  DeviceBuffer a, b, c, bias, addend, aux, bias_grad;
  GemmProblem model, plain;

  Operands(const Case& k, const Filler& fill)
      : a(stored_elements(k.m, k.k, k.a_t, k.lda) * 2),
        b(stored_elements(k.k, k.n, k.b_t, k.ldb) * 2),
        c(static_cast<size_t>(k.m * k.n) * 4),  // fp32 for the plain product; the model's C in its dtype
        bias(static_cast<size_t>(k.n) * 4),
        addend(k.addend ? static_cast<size_t>(k.m * k.n) * 4 : 0),
        aux(k.epilogue != GemmEpilogue::kNone ? static_cast<size_t>(k.m * k.n) * dtype_size(k.c_dtype) : 0),
        bias_grad(static_cast<size_t>(k.n) * 4) {
    fill.fill(a.p, stored_elements(k.m, k.k, k.a_t, k.lda) * 2, DType::kBF16);
    fill.fill(b.p, stored_elements(k.k, k.n, k.b_t, k.ldb) * 2, DType::kBF16);
    fill.fill(bias.p, static_cast<size_t>(k.n) * 4, DType::kF32);
    if (k.addend) fill.fill(addend.p, static_cast<size_t>(k.m * k.n) * 4, DType::kF32);
    // The forward's aux is written; the backward's (dgelu) is read: the pre-activation.
    if (k.epilogue == GemmEpilogue::kDGelu) fill.fill(aux.p, static_cast<size_t>(k.m * k.n) * 2, DType::kBF16);
    plain = gemm_problem(k.m, k.n, k.k, GemmInput{a.p, DType::kBF16, k.lda, k.a_t},
                         GemmInput{b.p, DType::kBF16, k.ldb, k.b_t}, static_cast<float*>(c.p));
    model = gemm_problem(k.m, k.n, k.k, plain.a, plain.b, c.p, k.c_dtype, k.c_dtype == DType::kBF16,
                         k.bias ? static_cast<const float*>(bias.p) : nullptr);
    if (k.addend) model.addend = static_cast<const float*>(addend.p);
    if (k.epilogue != GemmEpilogue::kNone) {
      model.epilogue = k.epilogue;
      model.aux = aux.p;
      model.aux_ld = k.n;
    }
    if (k.bias_grad) model.bias_grad = static_cast<float*>(bias_grad.p);
  }
};

struct Timed {
  double median_s = 0;    // one call, from the median group
  double enqueue_us = 0;  // host time per call, median group
};

// Runs every contender `warmup` times, then `iters` rounds of one group of
// kGroup calls each, the contenders' order alternating round to round.
std::vector<Timed> time_groups(int warmup, int iters, cudaStream_t stream,
                               const std::vector<std::function<void()>>& contenders) {
  cudaEvent_t start, stop;
  MP_CHECK_CUDA(cudaEventCreate(&start));
  MP_CHECK_CUDA(cudaEventCreate(&stop));
  for (const auto& run : contenders) {
    for (int i = 0; i < warmup; ++i) run();
  }
  synchronize_stream(stream, kDefaultWaitTimeout, "the gemm_cuda benchmark's warm-up");
  std::vector<std::vector<double>> gpu(contenders.size()), host(contenders.size());
  for (int i = 0; i < iters; ++i) {
    for (size_t j = 0; j < contenders.size(); ++j) {
      const size_t c = i % 2 == 0 ? j : contenders.size() - 1 - j;
      MP_CHECK_CUDA(cudaEventRecord(start, stream));
      const auto t0 = std::chrono::steady_clock::now();
      for (int g = 0; g < kGroup; ++g) contenders[c]();
      const auto t1 = std::chrono::steady_clock::now();
      MP_CHECK_CUDA(cudaEventRecord(stop, stream));
      synchronize_event(stop, kDefaultWaitTimeout, "a timed group of the gemm_cuda benchmark");
      float ms = 0;
      MP_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      gpu[c].push_back(ms / 1e3 / kGroup);
      host[c].push_back(std::chrono::duration<double>(t1 - t0).count() / kGroup * 1e6);
    }
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  std::vector<Timed> out;
  for (size_t c = 0; c < contenders.size(); ++c) {
    std::sort(gpu[c].begin(), gpu[c].end());
    std::sort(host[c].begin(), host[c].end());
    out.push_back(Timed{gpu[c][gpu[c].size() / 2], host[c][host[c].size() / 2]});
  }
  return out;
}

double tflops(const GemmProblem& p, double seconds) {
  return 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k) / seconds / 1e12;
}

// The plan the last gemm_cuda call made (gemm_cuda_new_plans()), as JSON.
nlohmann::ordered_json plan_json() {
  const std::vector<GemmPlanReport> plans = gemm_cuda_new_plans();
  if (plans.empty()) return {{"form", "cached (made by an earlier case)"}};
  const GemmPlanReport& r = plans.back();  // a plan replaced by the next form reports both
  return {{"problem", r.problem},
          {"form", r.form},
          {"algorithm", r.algorithm},
          {"candidates", r.candidates},
          {"plan_tflops", round_to(r.tflops, 1)}};
}

// The reference: the bf16 GEMM peak, C [n, n] bf16 = A B.
double peak_tflops(const BenchContext& ctx, cudaStream_t stream, const Filler& fill) {
  const int64_t n = 8192;
  const auto bytes = static_cast<size_t>(n * n) * 2;
  DeviceBuffer a(bytes), b(bytes), c(bytes);
  fill.fill(a.p, bytes, DType::kBF16);
  fill.fill(b.p, bytes, DType::kBF16);
  const GemmProblem p = gemm_problem(n, n, n, GemmInput{a.p, DType::kBF16, n, false},
                                     GemmInput{b.p, DType::kBF16, n, false}, c.p, DType::kBF16, true);
  gemm_cuda(p, stream);  // the plan, its candidates timed
  nlohmann::ordered_json plan = plan_json();
  const Timed t = time_groups(ctx.options.warmup, ctx.options.iters, stream, {[&] { gemm_cuda(p, stream); }})[0];
  const double peak = tflops(p, t.median_s);
  nlohmann::ordered_json row = {{"case", "peak_8192_bf16"}, {"value", round_to(peak, 1)}, {"unit", "TFLOP/s"}};
  if (const char* datasheet = std::getenv("MP_PEAK_TFLOPS"); datasheet != nullptr && std::atof(datasheet) > 0) {
    row["ref"] = "MP_PEAK_TFLOPS";
    row["ref_value"] = std::atof(datasheet);
    row["ratio"] = round_to(peak / std::atof(datasheet), 3);
  }
  row["better"] = "higher";
  row["ms"] = round_to(t.median_s * 1e3, 4);
  row["plan"] = plan;
  row["cublaslt"] = gemm_cuda_describe();
  row["device"] = describe_device(Device::cuda(0));
  ctx.reporter.emit(row);
  ctx.reporter.note(detail::str("peak: 8192^3 bf16 ", peak, " TFLOP/s (", gemm_cuda_describe(), ")"));
  return peak;
}

// One case's row: the model's problem and the plain product, timed in
// alternating rounds. Adds its time to the step's sums.
void run_case(const BenchContext& ctx, const Case& k, const std::string& b, double peak, cudaStream_t stream,
              const Filler& fill, double& step_s, double& plain_step_s) {
  Operands o(k, fill);
  gemm_cuda(o.model, stream);  // the plans, their candidates timed
  nlohmann::ordered_json plan = plan_json();
  gemm_cuda(o.plain, stream);
  nlohmann::ordered_json plain_plan = plan_json();
  const std::vector<Timed> t = time_groups(ctx.options.warmup, ctx.options.iters, stream,
                                           {[&] { gemm_cuda(o.model, stream); }, [&] { gemm_cuda(o.plain, stream); }});
  const double value = tflops(o.model, t[0].median_s), plain = tflops(o.plain, t[1].median_s);
  step_s += k.per_step * t[0].median_s;
  plain_step_s += k.per_step * t[1].median_s;
  nlohmann::ordered_json row = {{"case", k.name + b},
                                {"value", round_to(value, 1)},
                                {"unit", "TFLOP/s"},
                                {"ref", "peak_8192_bf16"},
                                {"ref_value", round_to(peak, 1)},
                                {"ratio", round_to(value / peak, 3)},
                                {"better", "higher"},
                                {"ms", round_to(t[0].median_s * 1e3, 4)},
                                {"plain_fp32_tflops", round_to(plain, 1)},
                                {"speedup_over_plain", round_to(t[1].median_s / t[0].median_s, 3)},
                                {"enqueue_us", round_to(t[0].enqueue_us, 1)},
                                {"m", k.m},
                                {"n", k.n},
                                {"k", k.k},
                                {"per_step", k.per_step},
                                {"plan", plan},
                                {"plain_plan", plain_plan}};
  ctx.reporter.emit(row);
  ctx.reporter.note(detail::str(k.name, b, ": ", value, " TFLOP/s as the model runs it, ", plain,
                                " as a plain fp32 product; ", plan.value("form", std::string("?"))));
}

// Every case at B = batch, then the step's sum; the names of the cases
// that failed (each an "error" row).
std::vector<std::string> run_batch(const BenchContext& ctx, int64_t batch, double peak, cudaStream_t stream,
                                   const Filler& fill) {
  const std::string b = "_b" + std::to_string(batch);
  double step_s = 0, plain_step_s = 0, step_flops = 0;
  std::vector<std::string> failed;
  for (const Case& k : step_cases(batch * kT)) {
    step_flops += k.per_step * 2.0 * static_cast<double>(k.m) * static_cast<double>(k.n) * static_cast<double>(k.k);
    try {
      run_case(ctx, k, b, peak, stream, fill, step_s, plain_step_s);
    } catch (const Error& e) {  // a shape cuBLASLt refuses, a device error: said in its row, the rest still run
      (void)gemm_cuda_new_plans();
      failed.push_back(k.name + b);
      ctx.reporter.emit({{"case", k.name + b}, {"error", e.what()}, {"m", k.m}, {"n", k.n}, {"k", k.k}});
    }
  }
  if (!failed.empty()) return failed;
  const double value = step_flops / step_s / 1e12;
  nlohmann::ordered_json row = {{"case", "step_gemms" + b},
                                {"value", round_to(value, 1)},
                                {"unit", "TFLOP/s"},
                                {"ref", "peak_8192_bf16"},
                                {"ref_value", round_to(peak, 1)},
                                {"ratio", round_to(value / peak, 3)},
                                {"better", "higher"},
                                {"ms", round_to(step_s * 1e3, 3)},
                                {"plain_fp32_ms", round_to(plain_step_s * 1e3, 3)},
                                {"step_tflop", round_to(step_flops / 1e12, 4)},
                                {"tokens", batch * kT}};
  ctx.reporter.emit(row);
  return failed;
}

}  // namespace

void run_gemm_cuda_suite(const BenchContext& ctx) {
  if (ctx.world.size() != 1) MP_THROW(ConfigError, "the gemm_cuda suite runs on one rank (-np 1)");
  const CudaInfo info = cuda_info();
  if (info.device_count == 0)
    MP_THROW(ConfigError, "the gemm_cuda suite needs a CUDA device: ", info.unavailable_reason);
  std::vector<int64_t> batches = ctx.options.sizes_bytes;  // --sizes: the batches B
  if (batches.empty()) batches = {4, 16};
  for (int64_t batch : batches) {
    if (batch < 1 || batch > 64) MP_THROW(ConfigError, "gemm_cuda: --sizes gives the batches B (1 to 64), got ", batch);
  }
  set_current_device(Device::cuda(0));
  cudaStream_t stream = nullptr;
  MP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<std::string> failed;
  {
    const Filler fill(stream);
    const double peak = peak_tflops(ctx, stream, fill);
    for (int64_t batch : batches) {
      for (std::string& name : run_batch(ctx, batch, peak, stream, fill)) failed.push_back(std::move(name));
    }
  }
  synchronize_stream(stream, kDefaultWaitTimeout, "the gemm_cuda benchmark's stream");
  (void)cudaStreamDestroy(stream);
  if (!failed.empty()) {
    std::string names;
    for (const std::string& n : failed) names += (names.empty() ? "" : ", ") + n;
    MP_THROW(CudaError, "gemm_cuda: ", failed.size(), " case(s) failed (their rows say why): ", names);
  }
}

}  // namespace mp::bench

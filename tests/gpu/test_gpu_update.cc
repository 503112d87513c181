// GPU tests (label "gpu"): the CUDA fused optimizer step against the CPU
// loop: the same element function compiled without FMA contraction, so the
// same bits (NaNs compare equal whatever their payload, the bf16 master's
// remainder included), on the vector path
// (16-byte aligned arrays) and the scalar one (misaligned), with a range
// table and step scalars in device memory; found_inf read on the device
// leaves every array untouched. And the device gradient statistics.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error_cuda.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/grad_stats.h"
#include "kernels/cpu/update.h"
#include "kernels/cuda/grad_stats_cuda.h"
#include "kernels/cuda/update_cuda.h"
#include "tests/gpu/gpu_test.h"
#include "tests/update_test_util.h"

namespace mp {
namespace {

// Kernels and copies on a non-blocking stream of the test's own, as the
// engine runs them.
class GpuUpdate : public testing::GpuStreamTest {};

// Device copy of a host vector, `offset` bytes past a 256-byte boundary,
// uploaded on `stream`; to_host downloads it on the same stream
// (testing::copy_on_stream).
struct DeviceArray {
  void* base = nullptr;
  void* p = nullptr;
  size_t bytes = 0;
  cudaStream_t stream = nullptr;
  DeviceArray(const void* host, size_t n_bytes, size_t offset, cudaStream_t s) : bytes(n_bytes), stream(s) {
    MP_CHECK_CUDA(cudaMalloc(&base, n_bytes + offset + 16));
    p = static_cast<char*>(base) + offset;
    testing::copy_on_stream(p, host, n_bytes, stream);
  }
  ~DeviceArray() { cudaFree(base); }
  void to_host(void* host) const { testing::copy_on_stream(host, p, bytes, stream); }
};

bool same(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, DType dtype) {
  const size_t es = static_cast<size_t>(dtype_size(dtype));
  for (size_t i = 0; i < a.size(); i += es) {
    if (std::memcmp(&a[i], &b[i], es) == 0) continue;
    const auto decode = [&](const uint8_t* p) {
      uint32_t u = 0;
      std::memcpy(&u, p, es);
      return es == 4 ? math::f32_from_bits(u) : dtype == DType::kBF16 ? math::bf16_bits_to_f32(static_cast<uint16_t>(u))
                                                                       : math::fp16_bits_to_f32(static_cast<uint16_t>(u));
    };
    if (!(std::isnan(decode(&a[i])) && std::isnan(decode(&b[i])))) {
      ADD_FAILURE() << "element " << i / es << " differs";
      return false;
    }
  }
  return true;
}

// The bf16 master's low halves bit for bit, except where the master is NaN
// (its high half, param_out, is): they are then the rest of a NaN's payload,
// which the device's arithmetic does not keep (it yields the canonical NaN)
// and the host's does.
bool same_remainders(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
                     const std::vector<uint8_t>& param_bf16) {
  for (size_t i = 0; i + 1 < want.size(); i += 2) {
    if (want[i] == got[i] && want[i + 1] == got[i + 1]) continue;
    uint16_t high = 0;
    std::memcpy(&high, &param_bf16[i], 2);
    if (std::isnan(math::bf16_bits_to_f32(high))) continue;
    ADD_FAILURE() << "remainder element " << i / 2 << " differs";
    return false;
  }
  return true;
}

std::vector<uint8_t> random_array(int64_t n, DType dtype, float scale, uint64_t seed, bool positive) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<uint8_t> out(static_cast<size_t>(n * dtype_size(dtype)));
  for (int64_t i = 0; i < n; ++i) {
    float x = normal(rng);
    if (positive) x = std::fabs(x);
    if (i % 1001 == 7) x = std::nanf("");
    const uint32_t bits = dtype == DType::kF32    ? math::f32_bits(x)
                          : dtype == DType::kBF16 ? math::f32_to_bf16_bits(x)
                                                  : math::f32_to_fp16_bits(x);
    std::memcpy(&out[static_cast<size_t>(i * dtype_size(dtype))], &bits, static_cast<size_t>(dtype_size(dtype)));
  }
  return out;
}

void check_variant(UpdateRule kind, MasterMode mode, DType grad, DType state, DType param, Rounding rounding,
                   size_t misalign, bool found_inf, cudaStream_t stream) {
  SCOPED_TRACE(::testing::Message() << "kind " << static_cast<int>(kind) << " mode " << static_cast<int>(mode)
                                    << " grad " << dtype_name(grad) << " state " << dtype_name(state) << " param "
                                    << dtype_name(param) << " stochastic " << (rounding == Rounding::kStochastic)
                                    << " misalign " << misalign << " found_inf " << found_inf);
  const int64_t n = (int64_t{1} << 20) + 13;
  // A skipped range (Muon's matrices) from inside a pack to inside another.
  const std::vector<UpdateRange> table{
      {0, 4096, 1.0f, 1.0f}, {4096, 4099, 0.5f, 0.0f}, {4099, 8203, 1.0f, 1.0f, 1}, {8203, n, 2.0f, 1.0f}};
  auto g = random_array(n, grad, 1.0f, 1, false);
  auto s0 = random_array(n, state, 0.1f, 2, false), s1 = random_array(n, state, 0.1f, 3, true);
  auto master = random_array(n, DType::kF32, 0.05f, 4, false);
  std::vector<uint8_t> out = random_array(n, param, 0.05f, 5, false), remainder(static_cast<size_t>(2 * n), 0);
  if (mode == MasterMode::kBf16Remainder) {
    for (int64_t i = 0; i < n; ++i) {
      float w;
      std::memcpy(&w, &master[static_cast<size_t>(4 * i)], 4);
      const auto split = math::split_bf16_remainder(w);
      std::memcpy(&out[static_cast<size_t>(2 * i)], &split.h, 2);
      std::memcpy(&remainder[static_cast<size_t>(2 * i)], &split.r, 2);
    }
  }
  OptimizerHyper h;
  h.rule = kind;
  h.weight_decay = 0.1f;
  h.momentum = kind == UpdateRule::kSgdMomentum ? 0.9f : 0.0f;
  StepScalars sc;
  sc.lr = 1e-3f;
  sc.grad_multiplier = 0.5f;
  sc.step = 4;
  sc.found_inf = found_inf ? 1 : 0;

  auto args = [&](void* gp, void* mp_, void* rp, void* s0p, void* s1p, void* op) {
    UpdateArgs a;
    a.hyper = h;
    a.n = n;
    a.master_mode = mode;
    a.master = mode == MasterMode::kFp32 ? static_cast<float*>(mp_) : nullptr;
    a.master_remainder = mode == MasterMode::kBf16Remainder ? static_cast<int16_t*>(rp) : nullptr;
    a.state0 = s0p;
    a.state1 = s1p;
    a.state_dtype = state;
    a.grad = gp;
    a.grad_dtype = grad;
    a.param_out = op;
    a.param_dtype = param;
    a.rounding = rounding;
    a.seed = 42;
    a.index_offset = 12345;
    a.num_ranges = static_cast<int64_t>(table.size());
    return a;
  };

  DeviceArray dg(g.data(), g.size(), misalign, stream), dm(master.data(), master.size(), misalign, stream),
      dr(remainder.data(), remainder.size(), misalign, stream), ds0(s0.data(), s0.size(), misalign, stream),
      ds1(s1.data(), s1.size(), misalign, stream), dout(out.data(), out.size(), misalign, stream),
      dtable(table.data(), table.size() * sizeof(UpdateRange), 0, stream), dsc(&sc, sizeof(sc), 0, stream);
  UpdateArgs da = args(dg.p, dm.p, dr.p, ds0.p, ds1.p, dout.p);
  da.ranges = static_cast<const UpdateRange*>(dtable.p);
  fused_update_cuda(da, static_cast<const StepScalars*>(dsc.p), stream);

  auto want_m = master, want_r = remainder, want_s0 = s0, want_s1 = s1, want_out = out;
  UpdateArgs ha = args(g.data(), want_m.data(), want_r.data(), want_s0.data(), want_s1.data(), want_out.data());
  ha.ranges = table.data();
  fused_update_cpu(ha, sc);

  std::vector<uint8_t> got_m(master.size()), got_r(remainder.size()), got_s0(s0.size()), got_s1(s1.size()),
      got_out(out.size());
  dm.to_host(got_m.data());
  dr.to_host(got_r.data());
  ds0.to_host(got_s0.data());
  ds1.to_host(got_s1.data());
  dout.to_host(got_out.data());
  EXPECT_TRUE(same(want_m, got_m, DType::kF32)) << "master";
  EXPECT_TRUE(same(want_s0, got_s0, state)) << "state0";
  EXPECT_TRUE(same(want_s1, got_s1, state)) << "state1";
  EXPECT_TRUE(same(want_out, got_out, param)) << "param_out";
  EXPECT_TRUE(same_remainders(want_r, got_r, want_out)) << "remainder";
  EXPECT_TRUE(std::equal(got_m.begin() + 4 * 4099, got_m.begin() + 4 * 8203, master.begin() + 4 * 4099))
      << "a skipped range's master was written";
  if (found_inf) {
    EXPECT_EQ(got_m, master) << "found_inf must leave the master untouched";
  }
}

TEST_F(GpuUpdate, FusedUpdateMatchesTheCpuLoop) {
  for (UpdateRule kind : testing::all_rules()) {
    for (DType grad : {DType::kF32, DType::kBF16, DType::kF16}) {
      check_variant(kind, MasterMode::kFp32, grad, DType::kF32, DType::kBF16, Rounding::kNearestEven, 0, false,
                    stream_);
    }
    check_variant(kind, MasterMode::kFp32, DType::kBF16, DType::kBF16, DType::kF16, Rounding::kStochastic, 0, false,
                  stream_);
    check_variant(kind, MasterMode::kBf16Remainder, DType::kBF16, DType::kF32, DType::kBF16, Rounding::kNearestEven, 0,
                  false, stream_);
    check_variant(kind, MasterMode::kNone, DType::kBF16, DType::kBF16, DType::kBF16, Rounding::kStochastic, 0, false,
                  stream_);
    // Misaligned by one element of the widest array: the scalar path.
    check_variant(kind, MasterMode::kFp32, DType::kBF16, DType::kF32, DType::kBF16, Rounding::kStochastic, 4, false,
                  stream_);
  }
  check_variant(UpdateRule::kAdamW, MasterMode::kFp32, DType::kBF16, DType::kF32, DType::kBF16,
                Rounding::kNearestEven, 0, true, stream_);
}

// The device gradient statistics against the CPU pass: the same sum of
// squares up to summation order, the same non-finite flag, and the same bits
// on a second run (no atomics).
TEST_F(GpuUpdate, GradStatsMatchTheCpuPassAndAreDeterministic) {
  const int64_t n = (int64_t{1} << 22) + 3;
  void* out_p = nullptr;
  void* ws_p = nullptr;
  MP_CHECK_CUDA(cudaMalloc(&out_p, sizeof(DeviceGradStats)));
  MP_CHECK_CUDA(cudaMalloc(&ws_p, static_cast<size_t>(grad_stats_cuda_workspace_bytes())));
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (bool poison : {false, true}) {
      auto host = random_array(n, dtype, 1.0f, 9, false);  // has NaNs every 1001 elements
      if (!poison) {
        for (int64_t i = 7; i < n; i += 1001) std::memset(&host[static_cast<size_t>(i * dtype_size(dtype))], 0,
                                                        static_cast<size_t>(dtype_size(dtype)));
      }
      DeviceArray g(host.data(), host.size(), 0, stream_);
      const GradStats want = grad_stats_cpu(host.data(), dtype, n, 0.5f);
      DeviceGradStats got[2];
      for (auto& r : got) {
        grad_stats_cuda(g.p, dtype, n, 0.5f, static_cast<DeviceGradStats*>(out_p), ws_p, stream_);
        testing::copy_on_stream(&r, out_p, sizeof(r), stream_);
      }
      EXPECT_EQ(got[0].non_finite != 0, want.non_finite) << dtype_name(dtype);
      EXPECT_EQ(want.non_finite, poison);
      if (!poison) {
        EXPECT_NEAR(got[0].sum_sq, want.sum_sq, 1e-12 * want.sum_sq) << dtype_name(dtype);
      }
      EXPECT_EQ(std::memcmp(&got[0], &got[1], sizeof(DeviceGradStats)), 0) << "not deterministic";
    }
  }
  cudaFree(out_p);
  cudaFree(ws_p);
}

}  // namespace
}  // namespace mp

// GPU tests (CTest label "gpu"; skipped without a device): the CUDA bodies of
// the engine's element ops (kernels/ops.h) against their CPU bodies. Each op
// runs on CUDA memory with a CudaStream and on the same data in host memory
// with a CpuStream; the results must be the same bits (any NaN equals any
// NaN: the GPU's fp32 arithmetic does not keep NaN payloads as x86 does),
// except grad_stats, whose sum of squares is reduced in another order (a
// relative 1e-12; the non-finite flag equal). fused_update reads its
// StepScalars from device memory, written on the stream before it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/cuda_stream.h"
#include "core/pinned.h"
#include "core/tensor.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/update.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu_test.h"
#include "tests/test_util.h"
#include "tests/update_test_util.h"

namespace mp {
namespace {

const DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// fp32 values with the awkward ones first (signed zeros, Inf, NaN with a
// payload, denormals, values that round across a binade, the largest
// finite), then random magnitudes.
std::vector<float> awkward_floats(int64_t n, uint32_t seed) {
  std::vector<float> v;
  for (uint32_t bits : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x00000001u,
                        0x80000003u, 0x3f808000u, 0x477ff000u, 0x43e80000u, 0x7f7fffffu}) {
    if (static_cast<int64_t>(v.size()) < n) v.push_back(math::f32_from_bits(bits));
  }
  std::mt19937 rng(seed);
  while (static_cast<int64_t>(v.size()) < n) {
    const uint32_t r = static_cast<uint32_t>(rng());
    v.push_back(std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(r % 40) - 20));
  }
  return v;
}

// Host tensor of dtype t holding `values` rounded to nearest-even.
Tensor host_tensor(Allocator& host, DType t, const std::vector<float>& values) {
  const auto n = static_cast<int64_t>(values.size());
  Tensor x = Tensor::empty(host, t, {n}, MemCategory::kOther);
  for (int64_t i = 0; i < n; ++i) {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      static_cast<T*>(x.data())[i] = math::from_f32<T>(values[static_cast<size_t>(i)]);
    });
  }
  return x;
}

bool is_nan_bits(const void* p, DType t) {
  uint32_t b = 0;
  std::memcpy(&b, p, dtype_size(t));
  switch (t) {
    case DType::kF32: return std::isnan(math::f32_from_bits(b));
    case DType::kBF16: return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0;
    case DType::kF16: return (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0;
    default: return false;
  }
}

// Same bits, except that any NaN equals any NaN.
::testing::AssertionResult same_bits(const void* got, const void* want, int64_t n, DType t, const std::string& what) {
  const size_t es = dtype_size(t);
  for (int64_t i = 0; i < n; ++i) {
    const char* g = static_cast<const char*>(got) + static_cast<size_t>(i) * es;
    const char* w = static_cast<const char*>(want) + static_cast<size_t>(i) * es;
    if (std::memcmp(g, w, es) == 0 || (is_nan_bits(g, t) && is_nan_bits(w, t))) continue;
    uint32_t gb = 0, wb = 0;
    std::memcpy(&gb, g, es);
    std::memcpy(&wb, w, es);
    return ::testing::AssertionFailure() << what << ": element " << i << " got bits 0x" << std::hex << gb
                                         << " want 0x" << wb;
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  if (got.dtype() != want.dtype() || got.numel() != want.numel()) {
    return ::testing::AssertionFailure() << what << ": " << got.describe() << " vs " << want.describe();
  }
  return same_bits(got.data(), want.data(), got.numel(), got.dtype(), what);
}

class GpuElementOps : public testing::GpuTest {
 protected:
  // Through pinned memory (core/pinned.h), waiting (bounded) before the
  // pinned copy is freed.
  Tensor to_device(const Tensor& h) {
    Tensor d = Tensor::empty(device_, h.dtype(), {h.numel()}, MemCategory::kOther);
    testing::PinnedHost pinned(h.dtype(), h.numel());
    if (h.size_bytes() > 0) std::memcpy(pinned.data(), h.data(), h.size_bytes());
    copy_tensor(d, pinned.tensor(), stream());
    stream()->synchronize();
    return d;
  }
  Tensor to_host(const Tensor& d) {
    testing::PinnedHost pinned(d.dtype(), d.numel());
    copy_tensor(pinned.tensor(), d, stream());
    stream()->synchronize();
    Tensor h = Tensor::empty(host_, d.dtype(), {d.numel()}, MemCategory::kOther);
    if (h.size_bytes() > 0) std::memcpy(h.data(), pinned.data(), h.size_bytes());
    return h;
  }
  Tensor copy_on_host(const Tensor& h) {
    Tensor c = Tensor::empty(host_, h.dtype(), {h.numel()}, MemCategory::kOther);
    std::memcpy(c.data(), h.data(), h.size_bytes());
    return c;
  }
  // Made after SetUp has found a device.
  CudaStream* stream() {
    if (!cuda_) cuda_ = std::make_unique<CudaStream>(Device::cuda(0), "ops");
    return cuda_.get();
  }

  Allocator host_;
  Allocator device_{Device::cuda(0)};
  CpuStream cpu_{"ops-cpu"};
  std::unique_ptr<CudaStream> cuda_;
};

TEST_F(GpuElementOps, ZeroZeroRangesAndFillNanMatchTheCpuBodies) {
  const int64_t n = (1 << 20) + 3;
  for (DType t : kFloatTypes) {
    const std::string what(dtype_name(t));
    Tensor want = host_tensor(host_, t, awkward_floats(n, 1));
    Tensor got = to_device(want);
    const std::vector<ops::Range> ranges{{n - 5, n}, {0, 1}, {100, 100}, {4096, 70001}};
    ops::zero_ranges(want, ranges, cpu_);
    ops::zero_ranges(got, ranges, *stream());
    ops::fill_nan(want, 7, cpu_);
    ops::fill_nan(got, 7, *stream());
    cpu_.synchronize();
    // fill_nan writes one quiet NaN pattern on both: compare exactly.
    Tensor back = to_host(got);
    EXPECT_EQ(std::memcmp(back.data(), want.data(), want.size_bytes()), 0) << what;

    ops::zero(want, cpu_);
    ops::zero(got, *stream());
    cpu_.synchronize();
    back = to_host(got);
    EXPECT_EQ(std::memcmp(back.data(), want.data(), want.size_bytes()), 0) << what << " zero";
  }
}

TEST_F(GpuElementOps, AccumulateMatchesTheCpuBodyForEveryDtypePair) {
  const int64_t n = (1 << 20) + 3;
  for (DType dt : kFloatTypes) {
    for (DType st : kFloatTypes) {
      for (bool overwrite : {false, true}) {
        const std::string what = std::string(dtype_name(st)) + " into " + std::string(dtype_name(dt)) +
                                 (overwrite ? " overwrite" : " add");
        Tensor src = host_tensor(host_, st, awkward_floats(n, 2));
        Tensor want = host_tensor(host_, dt, awkward_floats(n, 3));
        Tensor src_d = to_device(src), got = to_device(want);
        ops::accumulate(want, src, overwrite, cpu_);
        ops::accumulate(got, src_d, overwrite, *stream());
        cpu_.synchronize();
        ASSERT_TRUE(same_bits(to_host(got), want, what));
      }
    }
  }
}

TEST_F(GpuElementOps, Fp64AccumulationAndRoundingMatchTheCpuBodies) {
  const int64_t n = 300007;
  const int blocks = 5;
  Tensor src = host_tensor(host_, DType::kF32, awkward_floats(blocks * n, 4));
  Tensor src_d = to_device(src);
  std::vector<double> want(static_cast<size_t>(n), 0.0);
  Buffer acc_d = device_.allocate(static_cast<size_t>(n) * sizeof(double), MemCategory::kOther);
  auto* acc = static_cast<double*>(acc_d.data());
  // first, then more blocks on top of the first result
  ops::accumulate_f64(want.data(), Device::cpu(), src, blocks, n, true, cpu_);
  ops::accumulate_f64(want.data(), Device::cpu(), src, 2, n, false, cpu_);
  ops::accumulate_f64(acc, Device::cuda(0), src_d, blocks, n, true, *stream());
  ops::accumulate_f64(acc, Device::cuda(0), src_d, 2, n, false, *stream());
  Tensor want_out = Tensor::zeros(host_, DType::kF32, {n}, MemCategory::kOther);
  Tensor out_d = to_device(want_out);
  ops::round_f64(want.data(), want_out, n, cpu_);
  ops::round_f64(acc, out_d, n, *stream());
  PinnedBuffer got(Device::cuda(0), static_cast<size_t>(n) * sizeof(double));
  ops::copy_bytes(got.data(), Device::cpu(), acc, Device::cuda(0), static_cast<int64_t>(n * sizeof(double)), *stream());
  cpu_.synchronize();
  stream()->synchronize();
  for (int64_t i = 0; i < n; ++i) {
    const double g = got.as<double>()[i], w = want[static_cast<size_t>(i)];
    ASSERT_TRUE(std::memcmp(&g, &w, sizeof(double)) == 0 || (std::isnan(g) && std::isnan(w)))
        << "accumulator " << i << ": " << g << " vs " << w;
  }
  EXPECT_TRUE(same_bits(to_host(out_d), want_out, "round_f64"));
}

TEST_F(GpuElementOps, GradStatsMatchTheCpuBodyInSumAndFlag) {
  Buffer slot_d = device_.allocate(sizeof(ops::GradStatsSlot), MemCategory::kOther);
  Buffer workspace = device_.allocate(static_cast<size_t>(ops::grad_stats_workspace_bytes(Device::cuda(0))),
                                      MemCategory::kOther);
  auto* slot = static_cast<ops::GradStatsSlot*>(slot_d.data());
  for (DType t : kFloatTypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, (int64_t{1} << 22) + 3}) {
      for (bool poison : {false, true}) {
        if (poison && n == 0) continue;
        const std::string what = std::string(dtype_name(t)) + " n=" + std::to_string(n) + (poison ? " with NaN" : "");
        std::vector<float> values = awkward_floats(n, 5);
        // Finite values only (the awkward prefix holds Inf and NaN), then one NaN when poisoned.
        for (float& v : values) {
          if (!std::isfinite(v) || std::fabs(v) > 1e4f) v = 1.5f;
        }
        if (poison) values[static_cast<size_t>(n / 2)] = std::nanf("");
        Tensor g = host_tensor(host_, t, values);
        Tensor g_d = to_device(g);
        ops::GradStatsSlot want;
        ops::grad_stats(g, n, 0.5f, &want, nullptr, cpu_);
        ops::grad_stats(g_d, n, 0.5f, slot, workspace.data(), *stream());
        PinnedBuffer got_slot(Device::cuda(0), sizeof(ops::GradStatsSlot));
        const ops::GradStatsSlot& got = *got_slot.as<ops::GradStatsSlot>();
        ops::copy_bytes(got_slot.data(), Device::cpu(), slot, Device::cuda(0), sizeof(got), *stream());
        cpu_.synchronize();
        stream()->synchronize();
        EXPECT_EQ(got.non_finite, want.non_finite) << what;
        EXPECT_EQ(want.non_finite, poison ? 1 : 0) << what;
        if (!poison) {
          EXPECT_NEAR(got.sum_sq, want.sum_sq, 1e-12 * want.sum_sq) << what;
        }
      }
    }
  }
}

// The one-rank path's rounding inside the statistics pass: the rounded
// gradient bit for bit as the CPU body leaves it, the statistics as above.
TEST_F(GpuElementOps, GradStatsRoundingMatchesTheCpuBody) {
  Buffer slot_d = device_.allocate(sizeof(ops::GradStatsSlot), MemCategory::kOther);
  Buffer workspace = device_.allocate(static_cast<size_t>(ops::grad_stats_workspace_bytes(Device::cuda(0))),
                                      MemCategory::kOther);
  auto* slot = static_cast<ops::GradStatsSlot*>(slot_d.data());
  const int64_t n = (int64_t{1} << 20) + 7;
  for (DType wire : kFloatTypes) {
    for (double divisor : {1.0, 1.0 / 3.0}) {
      const std::string what = std::string(dtype_name(wire)) + " divisor " + std::to_string(divisor);
      std::vector<float> values = awkward_floats(n, 11);
      // Finite in every wire after the division: fp16 ends at 65504, so
      // |v| / divisor <= 6e4.
      const float limit = static_cast<float>(6e4 * divisor);
      for (float& v : values) {
        if (!std::isfinite(v) || std::fabs(v) > limit) v = 0.75f;
      }
      Tensor g = host_tensor(host_, DType::kF32, values);
      Tensor g_d = to_device(g);
      ops::GradStatsSlot want;
      ops::grad_stats(g, n, 0.5f, &want, nullptr, cpu_, ops::RoundThrough{wire, divisor});
      ops::grad_stats(g_d, n, 0.5f, slot, workspace.data(), *stream(), ops::RoundThrough{wire, divisor});
      PinnedBuffer got_slot(Device::cuda(0), sizeof(ops::GradStatsSlot));
      const ops::GradStatsSlot& got = *got_slot.as<ops::GradStatsSlot>();
      ops::copy_bytes(got_slot.data(), Device::cpu(), slot, Device::cuda(0), sizeof(got), *stream());
      cpu_.synchronize();
      EXPECT_TRUE(same_bits(to_host(g_d), g, what));  // waits for the stream: after the copy into got
      EXPECT_EQ(want.non_finite, 0) << what << ": the data must stay finite in the wire";
      EXPECT_EQ(got.non_finite, want.non_finite) << what;
      EXPECT_NEAR(got.sum_sq, want.sum_sq, 1e-12 * want.sum_sq) << what;
    }
  }
}

// One shard in every array the update touches, on the host and the device.
struct UpdateCase {
  int64_t n = 0;
  Tensor grad, master, s0, s1, param;  // host
  std::vector<UpdateRange> ranges;

  UpdateCase(Allocator& host, int64_t count, DType grad_t, DType state_t, DType param_t) : n(count) {
    grad = host_tensor(host, grad_t, awkward_floats(n, 6));
    std::vector<float> m = awkward_floats(n, 7), v = awkward_floats(n, 8), w = awkward_floats(n, 9);
    for (float& x : v) x = std::fabs(x);
    master = host_tensor(host, DType::kF32, w);
    s0 = host_tensor(host, state_t, m);
    s1 = host_tensor(host, state_t, v);
    param = host_tensor(host, param_t, w);
    ranges = {{0, 4096, 1.0f, 1.0f}, {4096, 4099, 0.5f, 0.0f}, {4099, n, 2.0f, 1.0f}};
  }
  UpdateArgs args(UpdateRule kind, const Tensor& g, const Tensor& m, const Tensor& a, const Tensor& b,
                  const Tensor& p, const UpdateRange* table) const {
    UpdateArgs x;
    x.hyper = testing::hyper_for(kind);
    x.n = n;
    x.master_mode = MasterMode::kFp32;
    x.master = m.data_as<float>();
    x.state0 = a.data();
    x.state1 = b.data();
    x.state_dtype = a.dtype();
    x.grad = g.data();
    x.grad_dtype = g.dtype();
    x.param_out = p.data();
    x.param_dtype = p.dtype();
    // Stochastic rounding where the copy is narrower than the fp32 update.
    x.rounding = p.dtype() == DType::kF32 ? Rounding::kNearestEven : Rounding::kStochastic;
    x.seed = 42;
    x.index_offset = 12345;
    x.ranges = table;
    x.num_ranges = static_cast<int64_t>(ranges.size());
    return x;
  }
};

TEST_F(GpuElementOps, FusedUpdateWithDeviceScalarsMatchesTheCpuLoop) {
  const int64_t n = (int64_t{1} << 20) + 13;
  for (UpdateRule kind : testing::all_rules()) {
    for (DType t : kFloatTypes) {
      for (bool found_inf : {false, true}) {
        const std::string what = "optimizer " + std::to_string(static_cast<int>(kind)) + " grad/state/param " +
                                 std::string(dtype_name(t)) + (found_inf ? " found_inf" : "");
        const DType state_t = t == DType::kF16 ? DType::kF32 : t;  // moments: fp32 or bf16
        UpdateCase c(host_, n, t, state_t, t);
        Tensor g = to_device(c.grad), m = to_device(c.master), a = to_device(c.s0), b = to_device(c.s1),
               p = to_device(c.param);
        Buffer table = device_.allocate(c.ranges.size() * sizeof(UpdateRange), MemCategory::kOther);
        PinnedBuffer table_h(Device::cuda(0), table.size_bytes());  // pinned sources: core/pinned.h
        std::memcpy(table_h.data(), c.ranges.data(), table.size_bytes());
        ops::copy_bytes(table.data(), Device::cuda(0), table_h.data(), Device::cpu(),
                        static_cast<int64_t>(table.size_bytes()), *stream());
        // The scalars are device memory, written on the stream before the update reads them.
        PinnedBuffer sc_h(Device::cuda(0), sizeof(StepScalars));
        StepScalars& sc = *sc_h.as<StepScalars>();
        sc = StepScalars{};
        sc.lr = 1e-3f;
        sc.grad_multiplier = 0.5f;
        sc.step = 4;
        sc.found_inf = found_inf ? 1 : 0;
        Buffer sc_d = device_.allocate(sizeof(StepScalars), MemCategory::kOther);
        ops::copy_bytes(sc_d.data(), Device::cuda(0), sc_h.data(), Device::cpu(), sizeof(sc), *stream());
        ops::fused_update(c.args(kind, g, m, a, b, p, static_cast<const UpdateRange*>(table.data())),
                          static_cast<const StepScalars*>(sc_d.data()), Device::cuda(0), *stream());

        Tensor wm = copy_on_host(c.master), wa = copy_on_host(c.s0), wb = copy_on_host(c.s1),
               wp = copy_on_host(c.param);
        fused_update_cpu(c.args(kind, c.grad, wm, wa, wb, wp, c.ranges.data()), sc);
        ASSERT_TRUE(same_bits(to_host(m), wm, what + " master"));
        ASSERT_TRUE(same_bits(to_host(a), wa, what + " state0"));
        ASSERT_TRUE(same_bits(to_host(b), wb, what + " state1"));
        ASSERT_TRUE(same_bits(to_host(p), wp, what + " param"));
        if (found_inf) {
          EXPECT_EQ(std::memcmp(to_host(m).data(), c.master.data(), c.master.size_bytes()), 0) << what;
        }
      }
    }
  }
}

TEST_F(GpuElementOps, CopyBytesInEveryDirectionAndOpsInStreamOrder) {
  const int64_t n = 100003;
  testing::PinnedHost pinned_src(DType::kF32, n), pinned_back(DType::kF32, n);  // core/pinned.h
  const Tensor& src = pinned_src.tensor();
  std::memcpy(src.data(), host_tensor(host_, DType::kF32, awkward_floats(n, 10)).data(), src.size_bytes());
  for (float& x : std::span<float>(src.data_as<float>(), static_cast<size_t>(n))) {
    if (!std::isfinite(x)) x = 2.0f;
  }
  Buffer a = device_.allocate(src.size_bytes(), MemCategory::kOther);
  Buffer b = device_.allocate(src.size_bytes(), MemCategory::kOther);
  std::span<float> back(pinned_back.tensor().data_as<float>(), static_cast<size_t>(n));
  std::fill(back.begin(), back.end(), -1.0f);
  const auto bytes = static_cast<int64_t>(src.size_bytes());
  ops::copy_bytes(a.data(), Device::cuda(0), src.data(), Device::cpu(), bytes, *stream());
  ops::copy_bytes(b.data(), Device::cuda(0), a.data(), Device::cuda(0), bytes, *stream());
  ops::copy_bytes(back.data(), Device::cpu(), b.data(), Device::cuda(0), bytes, *stream());
  stream()->synchronize();
  EXPECT_EQ(std::memcmp(back.data(), src.data(), src.size_bytes()), 0);

  // fill_nan, zero, accumulate twice, copy out: only this order gives 2 x src.
  Tensor dst = Tensor::wrap(b.data(), Device::cuda(0), DType::kF32, {n});
  Tensor src_d = Tensor::wrap(a.data(), Device::cuda(0), DType::kF32, {n});
  ops::fill_nan(dst, n, *stream());
  ops::zero(dst, *stream());
  ops::accumulate(dst, src_d, false, *stream());
  ops::accumulate(dst, src_d, false, *stream());
  ops::copy_bytes(back.data(), Device::cpu(), dst.data(), Device::cuda(0), bytes, *stream());
  stream()->synchronize();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(back[static_cast<size_t>(i)], 2.0f * src.data_as<float>()[i]) << "element " << i;
  }
}

TEST_F(GpuElementOps, MemoryAndStreamOnDifferentDevicesAreRefused) {
  Tensor d = Tensor::empty(device_, DType::kF32, {4}, MemCategory::kOther);
  Tensor h = Tensor::zeros(host_, DType::kF32, {4}, MemCategory::kOther);
  EXPECT_THROW(ops::zero(d, cpu_), EnforceError);        // CUDA memory, CPU stream
  EXPECT_THROW(ops::zero(h, *stream()), EnforceError);   // CPU memory, CUDA stream
  EXPECT_THROW(ops::accumulate(h, h, false, *stream()), EnforceError);
  EXPECT_THROW(ops::copy_bytes(d.data(), Device::cuda(0), h.data(), Device::cpu(), 16, cpu_), EnforceError);
}

// A stream-ordered copy with pageable host memory would block inside
// cudaMemcpyAsync, without a deadline, until the stream reached it: it is
// refused, naming the stream (core/pinned.h).
TEST_F(GpuElementOps, StreamCopiesRefusePageableHostMemory) {
  Tensor d = Tensor::empty(device_, DType::kF32, {4}, MemCategory::kOther);
  Tensor h = Tensor::zeros(host_, DType::kF32, {4}, MemCategory::kOther);  // the Allocator's: pageable
  EXPECT_FALSE(is_pinned_for(h.data(), Device::cuda(0)));
  const std::string e = testing::error_of<EnforceError>(
      [&] { ops::copy_bytes(h.data(), Device::cpu(), d.data(), Device::cuda(0), 16, *stream()); });
  EXPECT_TRUE(testing::contains(e, "pageable host memory on stream 'ops'")) << e;
  EXPECT_THROW(ops::copy_bytes(d.data(), Device::cuda(0), h.data(), Device::cpu(), 16, *stream()), EnforceError);
  EXPECT_THROW(copy_tensor(h, d, stream()), EnforceError);
  testing::PinnedHost pinned(DType::kF32, 4);
  EXPECT_TRUE(is_pinned_for(pinned.data(), Device::cuda(0)));
  EXPECT_TRUE(is_pinned_for(static_cast<char*>(pinned.data()) + 4, Device::cuda(0))) << "inside a pinned buffer";
  EXPECT_NO_THROW(copy_tensor(pinned.tensor(), d, stream()));
  EXPECT_NO_THROW(copy_tensor(h, d)) << "a synchronous copy may use pageable memory";
  stream()->synchronize();
}

}  // namespace
}  // namespace mp

// The engine's element ops (kernels/ops.h) on CPU memory: each op submitted
// to a CpuStream gives an exactly known answer or the answer of the CPU loop
// it wraps (accumulate_cpu, accumulate_f64_cpu, round_f64_cpu,
// grad_stats_cpu, fused_update_cpu), runs when the stream reaches it and in
// submission order, and argument errors throw at the call naming the
// problem. The CUDA bodies are compared with these in tests/gpu/test_gpu_ops.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "kernels/convert.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/accumulate.h"
#include "kernels/cpu/grad_stats.h"
#include "kernels/cpu/update.h"
#include "kernels/ops.h"
#include "mp/config.h"
#include "tests/test_util.h"
#include "tests/update_test_util.h"

namespace mp {
namespace {

using testing::contains;
using testing::error_of;

const DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// A CPU tensor of `n` elements of `t` holding f(i) rounded to t.
template <class F>
Tensor filled(Allocator& a, DType t, int64_t n, F f) {
  Tensor x = Tensor::empty(a, t, {n}, MemCategory::kOther);
  for (int64_t i = 0; i < n; ++i) {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      static_cast<T*>(x.data())[i] = math::from_f32<T>(f(i));
    });
  }
  return x;
}

float load(const Tensor& x, int64_t i) {
  return dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return math::to_f32(static_cast<const T*>(x.data())[i]);
  });
}

std::vector<uint8_t> bytes_of(const Tensor& x) {
  const auto* p = static_cast<const uint8_t*>(x.data());
  return std::vector<uint8_t>(p, p + x.size_bytes());
}

// Holds a stream back until release(): everything submitted meanwhile is
// queued, so a test can show that ops run when the stream reaches them.
class Gate {
 public:
  explicit Gate(Stream& stream) {
    gate_.submit([f = open_.get_future().share()] { f.wait(); });
    stream.wait(gate_.record());
  }
  ~Gate() { release(); }
  void release() {
    if (!released_) open_.set_value();
    released_ = true;
  }

 private:
  std::promise<void> open_;
  bool released_ = false;
  CpuStream gate_{"gate"};
};

class Ops : public ::testing::Test {
 protected:
  Allocator host_;
  CpuStream stream_{"ops"};
};

TEST_F(Ops, ZeroClearsEveryByteOfEveryDtype) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2}) {
    Tensor x = Tensor::empty(host_, t, {1001}, MemCategory::kOther);
    std::memset(x.data(), 0xa5, x.size_bytes());
    ops::zero(x, stream_);
    stream_.synchronize();
    EXPECT_EQ(bytes_of(x), std::vector<uint8_t>(x.size_bytes(), 0)) << dtype_name(t);
  }
  Tensor empty = Tensor::empty(host_, DType::kF32, {0}, MemCategory::kOther);
  ops::zero(empty, stream_);
  stream_.synchronize();
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::zero(Tensor(), stream_); }), "zero of an undefined tensor"));
}

TEST_F(Ops, ZeroRangesClearsExactlyTheRanges) {
  const int64_t n = 37;
  for (DType t : kFloatTypes) {
    Tensor x = filled(host_, t, n, [](int64_t i) { return static_cast<float>(i + 1); });
    // Unordered, touching both ends, and one empty range.
    ops::zero_ranges(x, {{30, 37}, {0, 3}, {10, 10}, {12, 20}}, stream_);
    stream_.synchronize();
    for (int64_t i = 0; i < n; ++i) {
      const bool cleared = i < 3 || (i >= 12 && i < 20) || i >= 30;
      EXPECT_EQ(load(x, i), cleared ? 0.0f : static_cast<float>(i + 1)) << dtype_name(t) << " element " << i;
    }
  }
  Tensor x = Tensor::zeros(host_, DType::kF32, {10}, MemCategory::kOther);
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::zero_ranges(x, {{0, 2}, {3, 11}}, stream_); }),
                       "zero_ranges: [3, 11) is outside fp32[10]"));
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::zero_ranges(x, {{-1, 2}}, stream_); }),
                       "zero_ranges: [-1, 2) is outside"));
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::zero_ranges(x, {{5, 4}}, stream_); }),
                       "zero_ranges: [5, 4) is outside"));
}

TEST_F(Ops, FillNanWritesAQuietNanToThePrefixOnly) {
  const uint32_t kNanBits[] = {0x7fc00000u, 0x7fc0u, 0x7e00u};  // fp32, bf16, fp16
  for (int k = 0; k < 3; ++k) {
    const DType t = kFloatTypes[k];
    Tensor x = filled(host_, t, 9, [](int64_t i) { return static_cast<float>(i); });
    ops::fill_nan(x, 5, stream_);
    stream_.synchronize();
    for (int64_t i = 0; i < 9; ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, static_cast<const char*>(x.data()) + i * static_cast<int64_t>(dtype_size(t)), dtype_size(t));
      if (i < 5) {
        EXPECT_EQ(bits, kNanBits[k]) << dtype_name(t) << " element " << i;
      } else {
        EXPECT_EQ(load(x, i), static_cast<float>(i)) << dtype_name(t) << " element " << i;
      }
    }
  }
  Tensor x = Tensor::zeros(host_, DType::kF32, {4}, MemCategory::kOther);
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::fill_nan(x, 5, stream_); }), "fill_nan of 5 elements of fp32[4]"));
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::fill_nan(x, -1, stream_); }), "fill_nan of -1 elements"));
  Tensor f8 = Tensor::zeros(host_, DType::kF8E4M3, {4}, MemCategory::kOther);
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::fill_nan(f8, 1, stream_); }), "fill_nan of 1 elements of fp8_e4m3"));
}

TEST_F(Ops, AccumulateEqualsTheCpuLoopForEveryDtypePair) {
  const int64_t n = 1003;
  auto src_value = [](int64_t i) { return static_cast<float>(std::sin(0.3 * static_cast<double>(i)) * (1 + i % 5)); };
  auto dst_value = [](int64_t i) { return static_cast<float>(std::cos(0.7 * static_cast<double>(i)) * 3); };
  for (DType dt : kFloatTypes) {
    for (DType st : kFloatTypes) {
      for (bool overwrite : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(st)) + " into " + std::string(dtype_name(dt)) +
                     (overwrite ? " overwrite" : " add"));
        Tensor src = filled(host_, st, n, src_value);
        Tensor dst = filled(host_, dt, n, dst_value);
        Tensor want = filled(host_, dt, n, dst_value);
        accumulate_cpu(want.data(), dt, src.data(), st, n, overwrite);
        ops::accumulate(dst, src, overwrite, stream_);
        stream_.synchronize();
        EXPECT_EQ(bytes_of(dst), bytes_of(want));
      }
    }
  }
  Tensor a = Tensor::zeros(host_, DType::kF32, {8}, MemCategory::kOther);
  Tensor b = Tensor::zeros(host_, DType::kF32, {9}, MemCategory::kOther);
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::accumulate(a, b, false, stream_); }),
                       "accumulate of fp32[9] on cpu into fp32[8] on cpu: same device and element count"));
  Tensor f8 = Tensor::zeros(host_, DType::kF8E5M2, {8}, MemCategory::kOther);
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::accumulate(f8, a, false, stream_); }),
                       "accumulate of fp32[8] on cpu into fp8_e5m2[8] on cpu"));
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::accumulate(a, Tensor(), false, stream_); }),
                       "accumulate of undefined into fp32[8]"));
}

// The local path of a one-rank reduction (grad_stats rounding the gradient
// in place) gives the bits of the path it replaces: convert into the wire
// dtype (with the loss-scale divisor), the widening copy, then the
// statistics; for every wire dtype, power-of-two and other divisors, NaN,
// Inf, denormals and the values that overflow a 16-bit wire.
TEST_F(Ops, GradStatsRoundingEqualsConvertingThroughTheWireAndBack) {
  const int64_t n = 200003;  // several blocks, with a tail
  auto value = [](int64_t i) -> float {
    switch (i % 41) {
      case 1: return i < 100000 ? 0.5f : std::numeric_limits<float>::quiet_NaN();
      case 2: return i < 100000 ? 0.25f : -std::numeric_limits<float>::infinity();
      case 3: return 1e-41f;
      case 4: return i < 100000 ? 6e4f : 1e38f;  // 1e38 overflows fp16
      case 5: return math::f32_from_bits(0x3f808000u);  // a bf16 tie
      default: return static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * std::pow(2.0, i % 23 - 11));
    }
  };
  for (int64_t count : {int64_t{99991}, n}) {  // finite only; then NaN and Inf too
    for (DType wire : kFloatTypes) {
      for (double divisor : {1.0, 0.25, 1.0 / 3.0, 65536.0}) {
        SCOPED_TRACE(std::string(dtype_name(wire)) + " divisor " + std::to_string(divisor) + " n " +
                     std::to_string(count));
        Tensor grad = filled(host_, DType::kF32, count, value);
        Tensor staged = Tensor::empty(host_, wire, {count}, MemCategory::kOther);
        Tensor want = Tensor::empty(host_, DType::kF32, {count}, MemCategory::kOther);
        convert(grad, staged, ConvertOptions{.divisor = divisor});
        convert(staged, want);
        const GradStats want_stats = grad_stats_cpu(want.data(), DType::kF32, count, 0.5f);
        ops::GradStatsSlot got;
        ops::grad_stats(grad, count, 0.5f, &got, nullptr, stream_, ops::RoundThrough{wire, divisor});
        stream_.synchronize();
        EXPECT_EQ(bytes_of(grad), bytes_of(want));
        EXPECT_EQ(got.non_finite != 0, want_stats.non_finite);
        if (!want_stats.non_finite) {
          EXPECT_EQ(got.sum_sq, want_stats.sum_sq);
        }
      }
    }
  }
  Tensor a = Tensor::zeros(host_, DType::kF32, {8}, MemCategory::kOther);
  Tensor h = Tensor::zeros(host_, DType::kBF16, {8}, MemCategory::kOther);
  ops::GradStatsSlot slot;
  EXPECT_TRUE(contains(error_of<EnforceError>([&] {
                         ops::grad_stats(a, 8, 1.0f, &slot, nullptr, stream_, ops::RoundThrough{DType::kF8E4M3, 1.0});
                       }),
                       "grad_stats rounding fp32[8] on cpu through fp8_e4m3"));
  EXPECT_TRUE(contains(error_of<EnforceError>([&] {
                         ops::grad_stats(h, 8, 1.0f, &slot, nullptr, stream_, ops::RoundThrough{DType::kBF16, 1.0});
                       }),
                       "an fp32 gradient"));
  EXPECT_TRUE(contains(error_of<EnforceError>([&] {
                         ops::grad_stats(a, 8, 1.0f, &slot, nullptr, stream_, ops::RoundThrough{DType::kBF16, 0.0});
                       }),
                       "a positive divisor"));
}

TEST_F(Ops, Fp64AccumulationAddsBlocksInOrderAndRoundsOnce) {
  const int64_t n = 301;
  const int blocks = 4;
  // Blocks 2^9 apart in magnitude: an fp32 sum would lose bits, fp64 keeps them.
  Tensor src = filled(host_, DType::kF32, blocks * n, [](int64_t j) {
    const int64_t k = j / n, i = j % n;
    return std::ldexp(static_cast<float>(std::sin(0.37 * static_cast<double>(i) + static_cast<double>(k))),
                      static_cast<int>(k) * 9 - 12);
  });
  std::vector<double> acc(static_cast<size_t>(n), 123.0);  // overwritten by `first`
  ops::accumulate_f64(acc.data(), Device::cpu(), src, blocks, n, /*first=*/true, stream_);
  ops::accumulate_f64(acc.data(), Device::cpu(), src, 1, n, /*first=*/false, stream_);  // block 0 once more
  Tensor out = Tensor::zeros(host_, DType::kF32, {n + 2}, MemCategory::kOther);
  ops::round_f64(acc.data(), out, n, stream_);
  stream_.synchronize();

  std::vector<double> want(static_cast<size_t>(n), 0.0);
  accumulate_f64_cpu(want.data(), src.data_as<float>(), blocks, n, n);
  accumulate_f64_cpu(want.data(), src.data_as<float>(), 1, n, n);
  std::vector<float> want_out(static_cast<size_t>(n));
  round_f64_cpu(want.data(), want_out.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<size_t>(i);
    double plain = 0.0;  // the float64 sum written out
    for (int k = 0; k < blocks; ++k) plain += static_cast<double>(src.data_as<float>()[k * n + i]);
    plain += static_cast<double>(src.data_as<float>()[i]);
    ASSERT_EQ(acc[u], want[u]) << "element " << i;
    ASSERT_EQ(acc[u], plain) << "element " << i;
    ASSERT_EQ(out.data_as<float>()[i], want_out[u]) << "element " << i;
    ASSERT_EQ(out.data_as<float>()[i], static_cast<float>(plain)) << "element " << i;
  }
  EXPECT_EQ(out.data_as<float>()[n], 0.0f) << "round_f64 wrote past n";

  EXPECT_TRUE(contains(error_of<EnforceError>([&] {
                         ops::accumulate_f64(acc.data(), Device::cpu(), src, blocks + 1, n, true, stream_);
                       }),
                       "accumulate_f64 of 5 blocks of 301 from fp32[1204] on cpu"));
  Tensor bf = Tensor::zeros(host_, DType::kBF16, {n}, MemCategory::kOther);
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::accumulate_f64(acc.data(), Device::cpu(), bf, 1, n, true, stream_); }),
                       "accumulate_f64 of 1 blocks of 301 from bf16[301]"));
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::round_f64(acc.data(), out, n + 3, stream_); }),
                       "round_f64 of 304 elements into fp32[303]"));
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::round_f64(acc.data(), bf, 1, stream_); }),
                       "round_f64 of 1 elements into bf16[301]"));
}

TEST_F(Ops, GradStatsEqualsTheCpuLoopAndFindsNonFinite) {
  EXPECT_EQ(ops::grad_stats_workspace_bytes(Device::cpu()), 0);
  const int64_t n = 2049;
  for (DType t : kFloatTypes) {
    Tensor g = filled(host_, t, n + 5, [](int64_t i) { return static_cast<float>(std::sin(0.1 * static_cast<double>(i))); });
    ops::GradStatsSlot slot{-1.0, 7, 0};
    ops::grad_stats(g, n, 0.5f, &slot, nullptr, stream_);
    stream_.synchronize();
    const GradStats want = grad_stats_cpu(g.data(), t, n, 0.5f);
    EXPECT_EQ(slot.sum_sq, want.sum_sq) << dtype_name(t);
    EXPECT_EQ(slot.non_finite, 0) << dtype_name(t);
    double plain = 0.0;  // float64 reference: the sum of squares is not order-exact, so a tolerance
    for (int64_t i = 0; i < n; ++i) {
      const double x = static_cast<double>(load(g, i) * 0.5f);
      plain += x * x;
    }
    EXPECT_NEAR(slot.sum_sq, plain, 1e-12 * plain) << dtype_name(t);

    // An Inf beyond n is not looked at; one inside is found.
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      static_cast<T*>(g.data())[n + 2] = math::from_f32<T>(std::numeric_limits<float>::infinity());
    });
    ops::grad_stats(g, n, 1.0f, &slot, nullptr, stream_);
    stream_.synchronize();
    EXPECT_EQ(slot.non_finite, 0) << dtype_name(t);
    ops::grad_stats(g, n + 5, 1.0f, &slot, nullptr, stream_);
    stream_.synchronize();
    EXPECT_EQ(slot.non_finite, 1) << dtype_name(t);
  }
  Tensor g = Tensor::zeros(host_, DType::kF32, {4}, MemCategory::kOther);
  ops::GradStatsSlot slot;
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::grad_stats(g, 5, 1.0f, &slot, nullptr, stream_); }),
                       "grad_stats of 5 elements of fp32[4]"));
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::grad_stats(g, 4, 1.0f, nullptr, nullptr, stream_); }),
                       "grad_stats of 4 elements of fp32[4]"));
}

// One AdamW shard: fp32 master and moments, bf16 gradient and copy, two
// parameter groups. `state` holds every array, so two states can be compared.
struct Shard {
  static constexpr int64_t kN = 517;
  std::vector<float> master, m, v;
  std::vector<uint16_t> grad, param;
  std::vector<UpdateRange> ranges{{0, 100, 1.0f, 1.0f}, {100, kN, 0.5f, 0.0f}};

  Shard() : master(kN), m(kN), v(kN), grad(kN), param(kN) {
    for (int64_t i = 0; i < kN; ++i) {
      const auto u = static_cast<size_t>(i);
      master[u] = static_cast<float>(std::sin(0.01 * static_cast<double>(i)));
      m[u] = 0.01f * static_cast<float>(i % 7);
      v[u] = 0.001f * static_cast<float>(i % 11);
      grad[u] = math::f32_to_bf16_bits(static_cast<float>(std::cos(0.3 * static_cast<double>(i))));
    }
  }
  UpdateArgs args() {
    UpdateArgs a;
    a.hyper = testing::hyper_for(UpdateRule::kAdamW);
    a.n = kN;
    a.master_mode = MasterMode::kFp32;
    a.master = master.data();
    a.state0 = m.data();
    a.state1 = v.data();
    a.state_dtype = DType::kF32;
    a.grad = grad.data();
    a.grad_dtype = DType::kBF16;
    a.param_out = param.data();
    a.param_dtype = DType::kBF16;
    a.ranges = ranges.data();
    a.num_ranges = static_cast<int64_t>(ranges.size());
    a.threads = 1;
    return a;
  }
  bool operator==(const Shard& o) const {
    return testing::same_bits(master, o.master) && testing::same_bits(m, o.m) && testing::same_bits(v, o.v) &&
           param == o.param;
  }
};

TEST_F(Ops, FusedUpdateReadsItsScalarsWhenItRuns) {
  Shard got, want;
  StepScalars scalars;
  scalars.found_inf = 1;  // what the scalars say when the op is called: a skipped step
  {
    Gate gate(stream_);
    ops::fused_update(got.args(), &scalars, Device::cpu(), stream_);
    // Written before the stream reaches the update, as the loss scaler and
    // the clipping do on a device: the update must see these values.
    scalars = StepScalars{};
    scalars.lr = 2e-3f;
    scalars.grad_multiplier = 0.25f;
    scalars.step = 3;
    gate.release();
    stream_.synchronize();
  }
  fused_update_cpu(want.args(), scalars);
  EXPECT_TRUE(got == want);
  EXPECT_FALSE(got == Shard()) << "the step changed nothing";

  // found_inf read at run time: nothing is written.
  Shard before = got;
  scalars.found_inf = 1;
  ops::fused_update(got.args(), &scalars, Device::cpu(), stream_);
  stream_.synchronize();
  EXPECT_TRUE(got == before);

  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::fused_update(got.args(), nullptr, Device::cpu(), stream_); }),
                       "fused_update without step scalars"));
}

TEST_F(Ops, CopyBytesBetweenHostBuffers) {
  std::vector<uint8_t> src(777), dst(777, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  ops::copy_bytes(dst.data(), Device::cpu(), src.data(), Device::cpu(), 700, stream_);
  stream_.synchronize();
  EXPECT_TRUE(std::equal(src.begin(), src.begin() + 700, dst.begin()));
  EXPECT_TRUE(std::all_of(dst.begin() + 700, dst.end(), [](uint8_t b) { return b == 0; }));
  ops::copy_bytes(nullptr, Device::cpu(), nullptr, Device::cpu(), 0, stream_);  // nothing to copy
  stream_.synchronize();
  EXPECT_TRUE(contains(error_of<EnforceError>([&] {
                         ops::copy_bytes(dst.data(), Device::cpu(), src.data(), Device::cpu(), -1, stream_);
                       }),
                       "copy_bytes of -1 bytes"));
  EXPECT_TRUE(contains(error_of<EnforceError>([&] {
                         ops::copy_bytes(nullptr, Device::cpu(), src.data(), Device::cpu(), 4, stream_);
                       }),
                       "copy_bytes of 4 bytes"));
}

// Ops queued behind a closed gate run in submission order once it opens:
// fill_nan, zero, accumulate twice, copy out. Any other order leaves a NaN,
// a stale value or a missing term in the copy.
TEST_F(Ops, OpsRunInSubmissionOrder) {
  const int64_t n = 4097;
  Tensor src = filled(host_, DType::kF32, n, [](int64_t i) { return static_cast<float>(i % 13) - 6.0f; });
  Tensor dst = filled(host_, DType::kF32, n, [](int64_t) { return 99.0f; });
  std::vector<float> out(static_cast<size_t>(n), -1.0f);
  {
    Gate gate(stream_);
    ops::fill_nan(dst, n, stream_);
    ops::zero(dst, stream_);
    ops::accumulate(dst, src, false, stream_);
    ops::accumulate(dst, src, false, stream_);
    ops::copy_bytes(out.data(), Device::cpu(), dst.data(), Device::cpu(), static_cast<int64_t>(dst.size_bytes()),
                    stream_);
    EXPECT_EQ(out[0], -1.0f) << "an op ran before the stream reached it";
    gate.release();
    stream_.synchronize();
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], 2.0f * src.data_as<float>()[i]) << i;
}

// A CPU body that throws fails its stream: later ops are skipped and the
// stream rethrows the first error (Note [Stream and event semantics]).
TEST_F(Ops, AFailedBodyFailsTheStreamAndSkipsLaterOps) {
  Shard shard;
  UpdateArgs bad = shard.args();
  bad.grad = nullptr;  // checked by fused_update_cpu on the stream, not at the call
  StepScalars scalars;
  Tensor x = filled(host_, DType::kF32, 8, [](int64_t) { return 1.0f; });
  ops::fused_update(bad, &scalars, Device::cpu(), stream_);
  ops::zero(x, stream_);
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { stream_.synchronize(); }), "fused update without a gradient"));
  EXPECT_EQ(x.data_as<float>()[0], 1.0f) << "the zero after the failure ran";
}

// CUDA memory with a CPU stream is refused at the call, before anything runs
// (a CUDA build checks the stream; a CPU-only build has no CUDA at all).
TEST_F(Ops, CudaMemoryOnACpuStreamIsRefused) {
  float fake = 0;  // never touched: the check comes first
  Tensor t = Tensor::wrap(&fake, Device::cuda(0), DType::kF32, {1});
#if MP_WITH_CUDA
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::zero(t, stream_); }),
                       "zero of cuda:0 memory on cpu stream 'ops'"));
  EXPECT_TRUE(contains(error_of<EnforceError>([&] { ops::accumulate(t, t, false, stream_); }),
                       "accumulate of cuda:0 memory on cpu stream 'ops'"));
#else
  EXPECT_TRUE(contains(error_of<ConfigError>([&] { ops::zero(t, stream_); }), "mp was built without CUDA"));
#endif
  EXPECT_EQ(fake, 0.0f);
}

}  // namespace
}  // namespace mp

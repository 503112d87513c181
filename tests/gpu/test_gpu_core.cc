// GPU tests (CTest label "gpu"): skipped when no CUDA device is present.
// The CUDA conversion kernel must give the same bits as the CPU loop, since
// both call the same MP_HD element function; plus CUDA streams, events and
// the accounting allocator on the device, streams that wait on the device
// for a host word (core/cuda_host_word.h), and host waits that end at their
// deadline with an error naming what they waited for (core/host_wait.h).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "core/cuda_host_word.h"
#include "core/cuda_stream.h"
#include "core/device.h"
#include "core/pinned.h"
#include "core/tensor.h"
#include "kernels/convert.h"
#include "kernels/convert_math.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu_test.h"

namespace mp {
namespace {

using Gpu = testing::GpuTest;

std::vector<float> test_inputs(size_t n) {
  std::vector<float> v;
  std::mt19937 rng(3);
  for (uint32_t bits : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f800001u,
                        0x00000001u, 0x3f808000u, 0x477ff000u, 0x43e80000u, 0x7f7fffffu}) {
    v.push_back(math::f32_from_bits(bits));
  }
  while (v.size() < n) {
    const uint32_t r = static_cast<uint32_t>(rng());
    v.push_back(v.size() % 2 ? math::f32_from_bits(r)
                             : std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng),
                                          static_cast<int>(r % 40) - 25));
  }
  return v;
}

TEST_F(Gpu, ConvertMatchesCpuBitForBitForEveryDtypePair) {
  constexpr int64_t n = (1 << 20) + 3;
  const auto input = test_inputs(n);
  Allocator host, device(Device::cuda(0));
  CudaStream stream(Device::cuda(0), "test");
  // The stream's copies go through pinned memory (core/pinned.h): room for n elements of any dtype.
  PinnedBuffer up(Device::cuda(0), static_cast<size_t>(n) * 8), down(Device::cuda(0), static_cast<size_t>(n) * 8);
  for (int s = 0; s < kNumDTypes; ++s) {
    for (int d = 0; d < kNumDTypes; ++d) {
      for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
        const auto st = static_cast<DType>(s), dt = static_cast<DType>(d);
        if (rounding == Rounding::kStochastic && is_fp8(dt)) continue;
        // Source in its dtype on the host, from the fp32 inputs.
        Tensor src_h = Tensor::empty(host, st, {n}, MemCategory::kOther);
        convert(Tensor::wrap(const_cast<float*>(input.data()), Device::cpu(), DType::kF32, {n}), src_h);
        ConvertOptions o;
        o.rounding = rounding;
        o.seed = 1234;
        o.step = 5;
        o.index_offset = 77;
        Tensor want = Tensor::empty(host, dt, {n}, MemCategory::kOther);
        convert(src_h, want, o);

        Tensor src_d = Tensor::empty(device, st, {n}, MemCategory::kOther);
        Tensor dst_d = Tensor::empty(device, dt, {n}, MemCategory::kOther);
        const Tensor src_p = Tensor::wrap(up.data(), Device::cpu(), st, {n});
        std::memcpy(src_p.data(), src_h.data(), src_h.size_bytes());
        copy_tensor(src_d, src_p, &stream);
        convert(src_d, dst_d, o, &stream);
        const Tensor got = Tensor::wrap(down.data(), Device::cpu(), dt, {n});
        copy_tensor(got, dst_d, &stream);
        stream.synchronize();
        ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size_bytes()), 0)
            << dtype_name(st) << " -> " << dtype_name(dt) << (rounding == Rounding::kStochastic ? " stochastic" : "");
      }
    }
  }
  EXPECT_EQ(device.stats().total_current_bytes, 0u);
}

TEST_F(Gpu, StreamsOrderWorkThroughEvents) {
  CudaStream a(Device::cuda(0), "a"), b(Device::cuda(0), "b");
  Allocator device(Device::cuda(0));
  constexpr int64_t n = 1 << 22;
  testing::PinnedHost ones(DType::kF32, n), back_h(DType::kBF16, n);  // core/pinned.h
  for (int64_t i = 0; i < n; ++i) ones.tensor().data_as<float>()[i] = 1.5f;
  Tensor x = Tensor::empty(device, DType::kF32, {n}, MemCategory::kActivations);
  Tensor y = Tensor::empty(device, DType::kBF16, {n}, MemCategory::kActivations);
  copy_tensor(x, ones.tensor(), &a);
  b.wait(a.record());
  convert(x, y, {}, &b);  // on b, after a's copy
  const Tensor& back = back_h.tensor();
  copy_tensor(back, y, &b);
  const Event done = b.record();
  done.synchronize();
  EXPECT_TRUE(done.query());
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(back.data_as<bf16>()[i].bits, 0x3fc0) << i;
  EXPECT_EQ(device.stats().current(MemCategory::kActivations), static_cast<size_t>(n) * 6);

  CpuStream cpu("cpu");
  cpu.wait(done);  // a CPU stream may wait for a CUDA event
  cpu.synchronize();
  bool release = false;
  cpu.submit([&] {
    while (!__atomic_load_n(&release, __ATOMIC_ACQUIRE)) std::this_thread::yield();
  });
  EXPECT_THROW(a.wait(cpu.record()), EnforceError) << "a CUDA stream must not block on an unfinished CPU event";
  __atomic_store_n(&release, true, __ATOMIC_RELEASE);
  cpu.synchronize();
}

// A host task that throws on CUDA's callback thread does not end the
// process: the stream keeps the error (named), later host tasks skip,
// events recorded after it and rethrow_failure rethrow it, and an event
// recorded before it does not.
TEST_F(Gpu, AHostTaskThatThrowsFailsItsStream) {
  CudaStream s(Device::cuda(0), "compute");
  const Event before = s.record();
  s.host_task([] { MP_THROW(NumericError, "planted"); }, TaskName{"loss", "head"});
  bool later_ran = false;
  s.host_task([&] { later_ran = true; });
  const Event after = s.record();
  EXPECT_NO_THROW(before.synchronize());
  const std::string want = "planted [op 'loss' of unit 'head' on stream 'compute']";
  try {
    after.synchronize();
    FAIL() << "no error";
  } catch (const NumericError& e) {
    EXPECT_TRUE(e.from_stream_task());
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  EXPECT_THROW(s.rethrow_failure(), NumericError);
  EXPECT_FALSE(later_ran);
}

// Note [Device waits on host words]: a stream that waits for a host word
// holds the work behind it, with no host thread blocked, until the word
// reaches the value (in cyclic order); a satisfied wait costs nothing.
TEST_F(Gpu, AStreamWaitsOnTheDeviceForAHostWord) {
  std::string why;
  ASSERT_TRUE(HostWord::supported(Device::cuda(0), &why)) << why;
  HostWord word(Device::cuda(0));
  CudaStream s(Device::cuda(0), "waits");
  PinnedBuffer out(Device::cuda(0), sizeof(float));
  Allocator device(Device::cuda(0));
  Tensor x = Tensor::empty(device, DType::kF32, {1}, MemCategory::kOther);
  testing::PinnedHost seven(DType::kF32, 1);
  seven.tensor().data_as<float>()[0] = 7.0f;

  word.wait_on(s.handle(), 0);  // already there
  copy_tensor(x, seven.tensor(), &s);
  s.synchronize();
  word.wait_on(s.handle(), 2);
  ops::copy_bytes(out.data(), Device::cpu(), x.data(), Device::cuda(0), sizeof(float), s);
  const Event done = s.record();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(done.query()) << "the copy ran before the word reached 2";
  EXPECT_EQ(*out.as<float>(), 0.0f);
  word.value().store(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(done.query()) << "1 is not 2";
  std::thread writer([&] { word.value().store(2); });  // any thread may write it
  writer.join();
  EXPECT_TRUE(done.wait_for(testing::kGpuTestWait));
  EXPECT_EQ(*out.as<float>(), 7.0f);

  // Cyclic order: 3 comes after 0xFFFFFFF0.
  word.value().store(0xFFFFFFF0u);
  word.wait_on(s.handle(), 3);
  const Event wrapped = s.record();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(wrapped.query());
  word.value().store(3);
  EXPECT_TRUE(wrapped.wait_for(testing::kGpuTestWait));
}

// Note [Bounded host waits]: a wait on an event the device never reaches
// (its stream waits for a host word nobody writes) ends at the stream's
// wait timeout with a CudaError naming the event, the stream and the
// device, and abandons the streams. In a child process, so the
// abandonment stays there.
TEST_F(Gpu, AWaitOnAnEventThatNeverCompletesEndsAtItsDeadline) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_current_device(Device::cuda(0));
        HostWord word(Device::cuda(0));
        auto s =
            Stream::create(Device::cuda(0), "stuck", StreamOptions{.wait_timeout = std::chrono::milliseconds(300)});
        (void)s->record();  // event #1
        word.wait_on(cuda_handle(s.get()), 1);
        const Event never = s->record();  // event #2
        const auto t0 = std::chrono::steady_clock::now();
        std::string message = "(no error)";
        try {
          never.synchronize();
        } catch (const CudaError& e) {
          message = e.message();
        }
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "%s | waited %.3f s, abandoned %d\n", message.c_str(), waited,
                     cpu_streams_abandoned() ? 1 : 0);
        const bool ok = waited >= 0.3 && waited < 5.0 && cpu_streams_abandoned();
        word.value().store(1);  // let the device go before the process ends
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "event #2 of CUDA stream 'stuck' \\(cuda:0\\) did not complete within 0\\.3 s");
}

// A CudaStream's destructor waits for its work at most its timeout, then
// reports what it leaves behind and goes on.
TEST_F(Gpu, AStreamDestructorWaitsWithinBounds) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_current_device(Device::cuda(0));
        HostWord word(Device::cuda(0));
        const auto t0 = std::chrono::steady_clock::now();
        {
          CudaStream s(Device::cuda(0), "left", std::chrono::milliseconds(300));
          word.wait_on(s.handle(), 1);
        }
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "destroyed after %.3f s\n", waited);
        word.value().store(1);
        std::_Exit(waited >= 0.3 && waited < 5.0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "the work of CUDA stream 'left' \\(cuda:0\\) did not finish within 0\\.3 s; the stream is left as it is");
}

TEST_F(Gpu, DeviceOutOfMemoryIsATypedError) {
  Allocator device(Device::cuda(0));
  EXPECT_THROW(device.allocate(size_t{1} << 50, MemCategory::kGatheredParams), OutOfMemoryError);
  EXPECT_EQ(device.stats().total_current_bytes, 0u);
}

}  // namespace
}  // namespace mp

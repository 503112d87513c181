// Core types: errors, dtypes, allocator accounting, tensors, devices.
#include <gtest/gtest.h>

#include <cstring>
#include <regex>

#include "mp/config.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace mp {
namespace {

TEST(Error, MessageNamesFileLineAndRank) {
  set_error_rank(3);
  try {
    MP_THROW(IoError, "cannot open ", "x.bin", ": ", 2);
    FAIL() << "no throw";
  } catch (const IoError& e) {
    EXPECT_TRUE(std::regex_match(e.what(), std::regex(R"(\[rank 3\] tests/test_core\.cc:\d+: cannot open x\.bin: 2)")))
        << e.what();
    EXPECT_EQ(e.message(), "cannot open x.bin: 2");
    EXPECT_EQ(e.rank(), 3);
  }
  set_error_rank(-1);
  try {
    MP_THROW(ConfigError, "bad");
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("tests/test_core.cc:", 0), 0u) << "no rank prefix when unknown: " << e.what();
  }
}

// launch/rank_main ends a rank normally on an agreed error and aborts the
// job on any other; the mark must survive a catch and rethrow and keep the
// error's type and message.
TEST(Error, AgreedMarkKeepsTypeAndMessageAndSurvivesRethrow) {
  try {
    MP_THROW(IoError, "local");
  } catch (const Error& e) {
    EXPECT_FALSE(e.agreed());
  }
  try {
    MP_THROW_AGREED(NumericError, "step ", 4, ": stop");
    FAIL() << "no throw";
  } catch (const NumericError& e) {
    EXPECT_TRUE(e.agreed());
    EXPECT_EQ(e.message(), "step 4: stop");
    EXPECT_NE(std::string(e.what()).find("tests/test_core.cc:"), std::string::npos) << e.what();
  }
  std::exception_ptr p;
  try {
    MP_THROW(ConfigError, "bad shard");
  } catch (...) {
    p = std::current_exception();
  }
  try {
    try {
      std::rethrow_exception(p);
    } catch (Error& e) {
      e.set_agreed();
      throw;
    }
  } catch (const ConfigError& e) {
    EXPECT_TRUE(e.agreed());
    EXPECT_EQ(e.message(), "bad shard");
  }
}

TEST(Error, EnforcePrintsBothOperandsAndEvaluatesOnce) {
  int calls = 0;
  auto next = [&] { return ++calls; };
  try {
    MP_ENFORCE_EQ(next(), 5, "while checking ", "counts");
    FAIL() << "no throw";
  } catch (const EnforceError& e) {
    EXPECT_NE(std::string(e.what()).find("Expected next() == 5, got 1 vs 5. while checking counts"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(calls, 1);
  EXPECT_NO_THROW(MP_ENFORCE_LT(1, 2));
  EXPECT_THROW(MP_ENFORCE_GE(1, 2), EnforceError);
  EXPECT_THROW(MP_ENFORCE(false), EnforceError);
  const uint8_t a = 7;
  try {
    MP_ENFORCE_NE(a, 7);
  } catch (const EnforceError& e) {
    EXPECT_NE(std::string(e.what()).find("got 7 vs 7"), std::string::npos) << "chars print as numbers: " << e.what();
  }
}

TEST(DType, NamesSizesAndParsing) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto t = static_cast<DType>(i);
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  }
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF8E5M2), 1u);
  try {
    parse_dtype("float16");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'float16'; valid: fp32, bf16"), std::string::npos);
  }
}

TEST(Allocator, CategoriesAddUpAndPeakTracks) {
  Allocator alloc;
  {
    Buffer master = alloc.allocate(1000, MemCategory::kMaster);
    Buffer grad = alloc.allocate(3u << 20, MemCategory::kGradient);  // huge-page path
    Buffer scratch = alloc.allocate(500, MemCategory::kCommScratch);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(grad.data()) % (2u << 20), 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(master.data()) % 64, 0u);
    std::memset(grad.data(), 1, grad.size_bytes());
    MemStats s = alloc.stats();
    EXPECT_EQ(s.current(MemCategory::kMaster), 1000u);
    EXPECT_EQ(s.current(MemCategory::kGradient), 3u << 20);
    EXPECT_EQ(s.total_current_bytes, 1000u + (3u << 20) + 500u);
    size_t sum = 0;
    for (size_t b : s.current_bytes) sum += b;
    EXPECT_EQ(sum, s.total_current_bytes);
    EXPECT_EQ(s.live_allocations, 3u);
    { Buffer moved = std::move(scratch); }  // freed through the moved-to buffer, once
    s = alloc.stats();
    EXPECT_EQ(s.current(MemCategory::kCommScratch), 0u);
    EXPECT_EQ(s.peak(MemCategory::kCommScratch), 500u);
    EXPECT_EQ(s.total_peak_bytes, 1000u + (3u << 20) + 500u);
    Buffer act = alloc.allocate(200, MemCategory::kActivations);
    s = alloc.stats();
    EXPECT_EQ(s.total_peak_bytes, 1000u + (3u << 20) + 500u) << "peak of the total, not a sum of peaks";
  }
  MemStats s = alloc.stats();
  EXPECT_EQ(s.total_current_bytes, 0u);
  EXPECT_EQ(s.live_allocations, 0u);
  EXPECT_EQ(s.total_allocations, 4u);
  alloc.reset_peaks();
  EXPECT_EQ(alloc.stats().total_peak_bytes, 0u);
  Buffer empty = alloc.allocate(0, MemCategory::kOther);
  EXPECT_EQ(empty.data(), nullptr);
}

TEST(Allocator, OutOfMemoryNamesTheRequest) {
  Allocator alloc;
  try {
    Buffer b = alloc.allocate(size_t{1} << 62, MemCategory::kActivations);
    FAIL() << "4 EiB allocation succeeded";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("bytes for activations"), std::string::npos) << e.what();
  }
  EXPECT_EQ(alloc.stats().total_current_bytes, 0u) << "a failed allocation is not counted";
}

TEST(Tensor, OwningViewsAndWrappedMemory) {
  Allocator alloc;
  Tensor t = Tensor::zeros(alloc, DType::kF32, {4, 8}, MemCategory::kMaster);
  EXPECT_EQ(t.numel(), 32);
  EXPECT_EQ(t.size_bytes(), 128u);
  EXPECT_TRUE(t.owns_memory());
  EXPECT_EQ(t.category(), MemCategory::kMaster);
  EXPECT_EQ(t.describe(), "fp32[4, 8] on cpu");
  for (int i = 0; i < 32; ++i) EXPECT_EQ(t.data_as<float>()[i], 0.0f);
  Tensor row = t.flat(8, 8);
  row.data_as<float>()[0] = 5;
  EXPECT_EQ(t.data_as<float>()[8], 5) << "views alias";
  EXPECT_THROW(t.flat(30, 3), EnforceError);
  EXPECT_THROW(t.data_as<bf16>(), EnforceError);
  EXPECT_THROW(t.reshape({5, 7}), EnforceError);
  EXPECT_EQ(t.reshape({32}).shape(), Shape{32});
  {
    Tensor keep = t.flat(0, 4);
    t = Tensor();
    row = Tensor();
    EXPECT_EQ(alloc.stats().current(MemCategory::kMaster), 128u) << "a view keeps its buffer alive";
  }
  EXPECT_EQ(alloc.stats().current(MemCategory::kMaster), 0u);

  std::vector<bf16> host(6);
  Tensor w = Tensor::wrap(host.data(), Device::cpu(), DType::kBF16, {2, 3});
  EXPECT_FALSE(w.owns_memory());
  Tensor copy = Tensor::empty(alloc, DType::kBF16, {6}, MemCategory::kOther);
  host[5].bits = 0x3f80;
  copy_tensor(copy, w.reshape({6}));
  EXPECT_EQ(copy.data_as<bf16>()[5].bits, 0x3f80);
  EXPECT_THROW(Tensor::empty(alloc, DType::kF32, {-1, 2}, MemCategory::kOther), ConfigError);
  EXPECT_THROW(Tensor::empty(alloc, DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}, MemCategory::kOther),
               ConfigError);
  Tensor zero = Tensor::empty(alloc, DType::kF16, {0, 5}, MemCategory::kOther);
  EXPECT_EQ(zero.numel(), 0);
}

TEST(Device, CudaBuildStartsAndFallsBackToCpuWithoutAGpu) {
  const CudaInfo info = cuda_info();
  if (info.device_count == 0) {
    EXPECT_FALSE(info.unavailable_reason.empty());
    EXPECT_EQ(default_device(3), Device::cpu());
#if MP_WITH_CUDA
    // This machine has no driver or no GPU: the reason comes from CUDA itself.
    EXPECT_NE(info.unavailable_reason.find("cuda"), std::string::npos) << info.unavailable_reason;
#endif
  } else {
    EXPECT_TRUE(info.unavailable_reason.empty());
    EXPECT_EQ(default_device(info.device_count + 1), Device::cuda(1 % info.device_count));
  }
  EXPECT_EQ(to_string(Device::cuda(2)), "cuda:2");
  EXPECT_NE(describe_device(Device::cpu()).find("cpu ("), std::string::npos);
}

}  // namespace
}  // namespace mp

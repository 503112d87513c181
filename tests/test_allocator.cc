// The allocator (core/allocator.h): per-category accounting, peaks, alignment,
// and an out-of-memory error that names the request.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "core/allocator.h"
#include "core/error.h"

namespace mp {
namespace {

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

}  // namespace
}  // namespace mp

// core/allocator.h: the accounting allocator. Every long-lived buffer is
// allocated through an Allocator with a category, so the runtime can report
// (and tests can assert) current and peak bytes per category: the basis of
// `mp_worker --plan`'s "measured equals predicted".
//
// Accounting counts the bytes asked for. CPU buffers are 64-byte aligned;
// buffers of 2 MiB or more are fresh anonymous mappings, 2 MiB aligned and
// advised as transparent huge pages, because first-touch page faults
// dominate the cost of fresh memory on these machines (about 9 us per 4 KiB
// page). Their pages are zero and not resident until first written
// (Buffer::zero_filled): a zeroed buffer costs no memory until it is used,
// so a rank's resident set grows as the engine's buffers are first used,
// not all at once when they are made. Buffers are meant to be allocated
// once and reused every step; there is no cache here by design.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/device.h"

namespace mp {

enum class MemCategory : uint8_t {
  kMaster = 0,          // fp32 master weights (or bf16 + remainder)
  kOptimizerState = 1,  // moments
  kGradient = 2,        // gradient buffers and shards
  kGatheredParams = 3,  // all-gathered parameter units
  kCommScratch = 4,     // staging and chunk buffers of collectives
  kActivations = 5,     // forward activations kept for backward, workspaces
  kOther = 6,
  kParamShards = 7,     // persistent low-precision parameter shards (the all-gather's source)
};
inline constexpr int kNumMemCategories = 8;

std::string_view mem_category_name(MemCategory c);  // "master", "optimizer_state", ...

struct MemStats {
  std::array<size_t, kNumMemCategories> current_bytes{};
  std::array<size_t, kNumMemCategories> peak_bytes{};
  size_t total_current_bytes = 0;
  size_t total_peak_bytes = 0;  // peak of the total, not the sum of category peaks
  size_t live_allocations = 0;
  size_t total_allocations = 0;

  size_t current(MemCategory c) const { return current_bytes[static_cast<int>(c)]; }
  size_t peak(MemCategory c) const { return peak_bytes[static_cast<int>(c)]; }
  std::string to_string() const;  // one line, MiB per non-empty category
};

namespace detail {
class AllocatorState;
}

// Owns one allocation; returns it (and its accounting) on destruction.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }
  // Fresh zero pages, untouched (CPU buffers of 2 MiB or more): zeros()
  // need not write them.
  bool zero_filled() const { return zero_filled_; }
  MemCategory category() const { return category_; }
  Device device() const;

 private:
  friend class Allocator;
  void release() noexcept;

  std::shared_ptr<detail::AllocatorState> state_;
  void* data_ = nullptr;
  size_t size_bytes_ = 0;
  MemCategory category_ = MemCategory::kOther;
  bool zero_filled_ = false;
};

// A handle to one device's accounting; copies share it. Thread-safe.
class Allocator {
 public:
  explicit Allocator(Device device = Device::cpu());

  Device device() const;
  // Throws OutOfMemoryError naming the request, category and current usage.
  // A zero-byte request gives an empty buffer (null data).
  Buffer allocate(size_t size_bytes, MemCategory category);
  MemStats stats() const;
  void reset_peaks();  // peaks := current

 private:
  std::shared_ptr<detail::AllocatorState> state_;
};

}  // namespace mp

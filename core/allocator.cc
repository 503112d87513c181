#include "core/allocator.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "core/cuda_device.h"
#include "core/error.h"
#include "mp/config.h"

namespace mp {

std::string_view mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::kMaster: return "master";
    case MemCategory::kOptimizerState: return "optimizer_state";
    case MemCategory::kGradient: return "gradient";
    case MemCategory::kGatheredParams: return "gathered_params";
    case MemCategory::kCommScratch: return "comm_scratch";
    case MemCategory::kActivations: return "activations";
    case MemCategory::kOther: return "other";
    case MemCategory::kParamShards: return "param_shards";
  }
  MP_THROW(EnforceError, "invalid MemCategory value ", static_cast<int>(c));
}

std::string MemStats::to_string() const {
  std::string out = detail::str("total ", total_current_bytes / 1048576.0, " MiB (peak ",
                                total_peak_bytes / 1048576.0, " MiB)");
  for (int i = 0; i < kNumMemCategories; ++i) {
    if (peak_bytes[i] == 0) continue;
    out += detail::str(", ", mem_category_name(static_cast<MemCategory>(i)), " ",
                       current_bytes[i] / 1048576.0, " MiB");
  }
  return out;
}

namespace detail {

class AllocatorState {
  static constexpr size_t kHuge = size_t{2} << 20;
  static size_t round_huge(size_t n) { return (n + kHuge - 1) / kHuge * kHuge; }

  // Fresh zero pages, kHuge aligned (the head and tail of a larger mapping
  // unmapped), advised as transparent huge pages; null when none are left.
  static void* map_zeroed(size_t size_bytes) {
    const size_t rounded = round_huge(size_bytes);
    void* raw = mmap(nullptr, rounded + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const auto at = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (at + kHuge - 1) / kHuge * kHuge;
    if (aligned > at) (void)munmap(raw, aligned - at);
    if (aligned - at < kHuge) (void)munmap(reinterpret_cast<void*>(aligned + rounded), kHuge - (aligned - at));
    auto* p = reinterpret_cast<void*>(aligned);
    (void)madvise(p, rounded, MADV_HUGEPAGE);  // advisory only
    return p;
  }

 public:
  explicit AllocatorState(Device device) : device_(device) {}
  Device device() const { return device_; }

  void* raw_allocate(size_t size_bytes) {
    if (device_.is_cuda()) {
#if MP_WITH_CUDA
      return cuda_malloc(device_.index, size_bytes);
#else
      MP_THROW(ConfigError, "allocation on ", device_, ": mp was built without CUDA");
#endif
    }
    if (mapped(size_bytes)) return map_zeroed(size_bytes);
    return std::aligned_alloc(64, (size_bytes + 63) / 64 * 64);
  }

  // CPU buffers of kHuge bytes or more are their own anonymous mappings.
  bool mapped(size_t size_bytes) const { return device_.is_cpu() && size_bytes >= kHuge; }

  void raw_free(void* p, size_t size_bytes) noexcept {
    if (device_.is_cuda()) {
#if MP_WITH_CUDA
      cuda_free(device_.index, p);
#endif
      return;
    }
    if (mapped(size_bytes)) {
      (void)munmap(p, round_huge(size_bytes));
      return;
    }
    std::free(p);
  }

  void on_allocate(size_t size_bytes, MemCategory c) {
    std::lock_guard<std::mutex> lock(mu_);
    const int i = static_cast<int>(c);
    stats_.current_bytes[i] += size_bytes;
    stats_.total_current_bytes += size_bytes;
    if (stats_.current_bytes[i] > stats_.peak_bytes[i]) stats_.peak_bytes[i] = stats_.current_bytes[i];
    if (stats_.total_current_bytes > stats_.total_peak_bytes) {
      stats_.total_peak_bytes = stats_.total_current_bytes;
    }
    ++stats_.live_allocations;
    ++stats_.total_allocations;
  }

  void on_free(size_t size_bytes, MemCategory c) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.current_bytes[static_cast<int>(c)] -= size_bytes;
    stats_.total_current_bytes -= size_bytes;
    --stats_.live_allocations;
  }

  MemStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void reset_peaks() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes = stats_.current_bytes;
    stats_.total_peak_bytes = stats_.total_current_bytes;
  }

 private:
  const Device device_;
  mutable std::mutex mu_;
  MemStats stats_;
};

}  // namespace detail

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept { *this = std::move(other); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
    data_ = other.data_;
    size_bytes_ = other.size_bytes_;
    category_ = other.category_;
    zero_filled_ = other.zero_filled_;
    other.data_ = nullptr;
    other.size_bytes_ = 0;
  }
  return *this;
}

Device Buffer::device() const { return state_ ? state_->device() : Device::cpu(); }

void Buffer::release() noexcept {
  if (!state_) return;
  if (data_) state_->raw_free(data_, size_bytes_);
  state_->on_free(size_bytes_, category_);
  state_.reset();
  data_ = nullptr;
  size_bytes_ = 0;
}

Allocator::Allocator(Device device) : state_(std::make_shared<detail::AllocatorState>(device)) {}

Device Allocator::device() const { return state_->device(); }

Buffer Allocator::allocate(size_t size_bytes, MemCategory category) {
  const int c = static_cast<int>(category);
  MP_ENFORCE(c >= 0 && c < kNumMemCategories, "invalid MemCategory value ", c);
  Buffer b;
  if (size_bytes > 0) {
    b.data_ = state_->raw_allocate(size_bytes);
    b.zero_filled_ = b.data_ != nullptr && state_->mapped(size_bytes);
    if (b.data_ == nullptr) {
      MP_THROW(OutOfMemoryError, "out of memory on ", state_->device(), " allocating ", size_bytes,
               " bytes for ", mem_category_name(category), "; in use: ", stats().to_string());
    }
  }
  b.state_ = state_;
  b.size_bytes_ = size_bytes;
  b.category_ = category;
  state_->on_allocate(size_bytes, category);
  return b;
}

MemStats Allocator::stats() const { return state_->stats(); }

void Allocator::reset_peaks() { state_->reset_peaks(); }

}  // namespace mp

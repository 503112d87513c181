#include "core/pinned.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "mp/config.h"
#if MP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_stream.h"
#include "core/error_cuda.h"
#endif

namespace mp {

bool is_pinned_for(const void* host, Device device) {
  if (device.is_cpu()) return true;
#if MP_WITH_CUDA
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, host) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky, but leave nothing for the next check
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
#else
  (void)host;
  return false;
#endif
}

PinnedBuffer::PinnedBuffer(Device device, size_t bytes) : device_(device), size_bytes_(bytes) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    // As the Allocator's buffers: 2 MiB or more are 2 MiB aligned and advised
    // as transparent huge pages (before the first touch below).
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t alignment = bytes >= kHuge ? kHuge : 64;
    const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    data_ = std::aligned_alloc(alignment, rounded);
    if (data_ == nullptr) MP_THROW(OutOfMemoryError, "host buffer of ", bytes, " bytes");
    if (alignment == kHuge) (void)madvise(data_, rounded, MADV_HUGEPAGE);  // advisory only
  } else {
#if MP_WITH_CUDA
    CudaDeviceGuard guard(device);
    MP_CHECK_CUDA(cudaMallocHost(&data_, bytes));
#else
    MP_THROW(ConfigError, "pinned host memory for ", device, ": mp was built without CUDA");
#endif
  }
  std::memset(data_, 0, bytes);
}

PinnedBuffer::~PinnedBuffer() { release(); }

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

void PinnedBuffer::release() noexcept {
  if (data_ == nullptr) return;
  if (device_.is_cpu()) {
    std::free(data_);
  } else {
#if MP_WITH_CUDA
    (void)cudaFreeHost(data_);
#endif
  }
  data_ = nullptr;
  size_bytes_ = 0;
}

}  // namespace mp

// core/pinned.h: host memory that a device's streams copy into and out of
// without blocking the host thread. For a CUDA device it is page-locked
// (cudaMallocHost), so cudaMemcpyAsync to or from it is truly asynchronous
// (to pageable memory the call itself waits until the stream reaches the
// copy, which would turn every bounded wait behind it into an unbounded
// one). For the CPU it is ordinary 64-byte aligned memory; 2 MiB or more is
// 2 MiB aligned and advised as transparent huge pages, as the Allocator's
// buffers. Either way 2 MiB or more is page aligned (O_DIRECT can write it). Every value that
// comes back from the engine's device to the host (losses, gradient
// statistics, sampled logits) lands in a PinnedBuffer through a
// stream-ordered copy (ops::copy_bytes), and tokens go the other way through
// one.
//
// Not accounted by the Allocator (core/allocator.h): these are small host
// buffers beside the device's memory. The owner makes sure that no copy
// still queued on a stream reads or writes a buffer it frees.
//
// Stream-ordered copies between host and CUDA memory (ops::copy_bytes,
// copy_tensor on a stream) check with is_pinned_for that their host side is
// pinned, and refuse pageable memory (EnforceError): such a copy would wait,
// inside the CUDA call and without a deadline, for the stream to reach it
// (Note [Bounded host waits] in core/host_wait.h).
#pragma once

#include <cstddef>

#include "core/device.h"

namespace mp {

// Whether host memory at `host` can take part in asynchronous copies with
// `device`'s memory: always for the CPU; for a CUDA device, when it is
// page-locked (a PinnedBuffer, cudaMallocHost or cudaHostRegister memory).
bool is_pinned_for(const void* host, Device device);

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  // `bytes` of host memory for copies with `device`'s memory; zero-filled.
  // Throws OutOfMemoryError (CPU) or CudaError (CUDA).
  PinnedBuffer(Device device, size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size_bytes() const { return size_bytes_; }
  // The device whose copies it serves.
  Device device() const { return device_; }

 private:
  void release() noexcept;

  Device device_;
  void* data_ = nullptr;
  size_t size_bytes_ = 0;
};

}  // namespace mp

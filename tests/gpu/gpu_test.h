// tests/gpu/gpu_test.h: the fixture of every GPU test, and the one way tests
// copy between host and device memory. Without a device each test skips in
// SetUp with a message starting "no CUDA device: ", which
// tests/CMakeLists.txt turns into a CTest "Skipped". Every wait of a test on
// the device is bounded (kGpuTestWait; Note [Bounded host waits] in
// core/host_wait.h), and every copy on a stream has a pinned host side
// (core/pinned.h): a hang names itself instead of using up the test's time.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstring>

#include "core/cuda_stream.h"
#include "core/device.h"
#include "core/error_cuda.h"
#include "core/pinned.h"
#include "core/tensor.h"

namespace mp::testing {

// How long a test waits for the device before it fails with an error that
// names what it waited for: as long as the multi-rank GPU tests' collectives
// (tests/gpu/gpu_comm.h).
inline constexpr std::chrono::seconds kGpuTestWait{60};

// A host tensor in pinned memory, for copies on a stream (core/pinned.h).
class PinnedHost {
 public:
  PinnedHost(DType dtype, int64_t n, Device device = Device::cuda(0))
      : buffer_(device, static_cast<size_t>(n) * dtype_size(dtype)),
        tensor_(Tensor::wrap(buffer_.data(), Device::cpu(), dtype, {n})) {}
  const Tensor& tensor() const { return tensor_; }
  void* data() const { return buffer_.data(); }

 private:
  PinnedBuffer buffer_;
  Tensor tensor_;
};

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaInfo info = cuda_info();
    if (info.device_count == 0) GTEST_SKIP() << "no CUDA device: " << info.unavailable_reason;
    set_current_device(Device::cuda(0));
  }
};

// A GpuTest with a non-blocking stream of its own, as the engine's streams
// are: only the stream orders the test's copies (copy_on_stream) and
// kernels.
class GpuStreamTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    MP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

// Waits for every piece of work on `stream`, at most kGpuTestWait.
inline void wait_for_stream(cudaStream_t stream) { synchronize_stream(stream, kGpuTestWait, "the test's CUDA stream"); }

// Copies `bytes` from `src` to `dst`, host to device or device to host
// (any host memory: pageable memory goes through a pinned bounce buffer),
// on the test's `stream`, and waits for that stream (bounded): the copy
// runs after the work already on the stream, work enqueued later runs
// after it, and on return the host may read or reuse its buffer. A plain
// cudaMemcpy runs on the legacy default stream instead, which a
// non-blocking stream is not ordered with.
inline void copy_on_stream(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  cudaPointerAttributes to{};
  MP_CHECK_CUDA(cudaPointerGetAttributes(&to, dst));
  const bool to_device = to.type == cudaMemoryTypeDevice || to.type == cudaMemoryTypeManaged;
  const void* host = to_device ? src : dst;
  if (is_pinned_for(host, Device::cuda(0))) {
    MP_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
    wait_for_stream(stream);
    return;
  }
  PinnedBuffer bounce(Device::cuda(0), bytes);
  if (to_device) std::memcpy(bounce.data(), src, bytes);
  MP_CHECK_CUDA(cudaMemcpyAsync(to_device ? dst : bounce.data(), to_device ? bounce.data() : src, bytes,
                                cudaMemcpyDefault, stream));
  wait_for_stream(stream);
  if (!to_device) std::memcpy(dst, bounce.data(), bytes);
}

}  // namespace mp::testing

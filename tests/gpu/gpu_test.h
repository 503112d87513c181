// tests/gpu/gpu_test.h: the fixture of every GPU test, and the one way tests
// copy between host and device memory. Without a device each test skips in
// SetUp with a message starting "no CUDA device: ", which
// tests/CMakeLists.txt turns into a CTest "Skipped".
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>

#include "core/device.h"
#include "core/error_cuda.h"

namespace mp::testing {

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

// Copies `bytes` from `src` to `dst`, host to device or device to host
// (pageable host memory is fine), on the test's `stream`, and waits for that
// stream: the copy runs after the work already on the stream, work enqueued
// later runs after it, and on return the host may read or reuse its buffer.
// A plain cudaMemcpy runs on the legacy default stream instead, which a
// non-blocking stream is not ordered with.
inline void copy_on_stream(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  MP_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  MP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace mp::testing

// tests/gpu/gpu_test.h: the fixture of every GPU test. Without a device
// each test skips in SetUp with a message starting "no CUDA device: ",
// which tests/CMakeLists.txt turns into a CTest "Skipped".
#pragma once

#include <gtest/gtest.h>

#include "core/device.h"

namespace mp::testing {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaInfo info = cuda_info();
    if (info.device_count == 0) GTEST_SKIP() << "no CUDA device: " << info.unavailable_reason;
    set_current_device(Device::cuda(0));
  }
};

}  // namespace mp::testing

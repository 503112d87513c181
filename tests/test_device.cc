// Devices (core/device.h): a CUDA build starts without a GPU and says why;
// device names. (Which device a rank takes: tests/test_device_choice.cc.)
#include <gtest/gtest.h>

#include <string>

#include "core/device.h"
#include "mp/config.h"

namespace mp {
namespace {

TEST(Device, CudaBuildStartsAndFallsBackToCpuWithoutAGpu) {
  const CudaInfo info = cuda_info();
  if (info.device_count == 0) {
    EXPECT_FALSE(info.unavailable_reason.empty());
#if MP_WITH_CUDA
    // This machine has no driver or no GPU: the reason comes from CUDA itself.
    EXPECT_NE(info.unavailable_reason.find("cuda"), std::string::npos) << info.unavailable_reason;
#endif
  } else {
    EXPECT_TRUE(info.unavailable_reason.empty());
  }
  EXPECT_EQ(to_string(Device::cuda(2)), "cuda:2");
  EXPECT_NE(describe_device(Device::cpu()).find("cpu ("), std::string::npos);
}

}  // namespace
}  // namespace mp

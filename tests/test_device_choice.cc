// compute.device (launch/device_choice.h, Note [Device choice]): AUTO,
// CPU and CUDA on nodes with no driver, no device, too few devices and
// enough, and for a model with and without device kernels.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "launch/device_choice.h"

namespace mp {
namespace {

// `f` throws ConfigError whose message contains `part`.
template <class F>
void expect_config_error(F f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected: " << part;
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find(part), std::string::npos) << e.message();
  }
}

using proto::ComputeConfig;

const CudaInfo kNoDriver{0, "no usable CUDA driver (cudaErrorInsufficientDriver: CUDA driver version is insufficient)"};
const CudaInfo kTwoGpus{2, ""};

TEST(DeviceChoice, AutoTakesTheLocalRanksGpu) {
  const DeviceChoice c = choose_device(ComputeConfig::AUTO, 5, 1, 2, kTwoGpus);
  EXPECT_EQ(c.device, Device::cuda(1));
  EXPECT_EQ(c.note, "compute.device AUTO: CUDA device 1 of 2");
}

TEST(DeviceChoice, AutoFallsBackToTheCpuAndSaysWhy) {
  EXPECT_EQ(choose_device(ComputeConfig::AUTO, 0, 0, 1, kNoDriver).note,
            "compute.device AUTO: the CPU (" + kNoDriver.unavailable_reason + ")");
  const DeviceChoice few = choose_device(ComputeConfig::AUTO, 3, 3, 4, kTwoGpus);
  EXPECT_EQ(few.device, Device::cpu());
  EXPECT_NE(few.note.find("this node shows 2 CUDA device(s) for 4 local ranks"), std::string::npos) << few.note;
  EXPECT_EQ(choose_device(ComputeConfig::AUTO, 0, 0, 1, CudaInfo{}).note,
            "compute.device AUTO: the CPU (no CUDA device visible)");
}

TEST(DeviceChoice, SharedGpusAreTakenInTurn) {
  const DeviceChoice c = choose_device(ComputeConfig::CUDA, 3, 3, 4, kTwoGpus, /*share_gpus=*/true);
  EXPECT_EQ(c.device, Device::cuda(1));
  EXPECT_TRUE(c.shared);
  EXPECT_EQ(c.note, "4 local ranks share 2 CUDA device(s) (compute.share_gpus)");
  const DeviceChoice a = choose_device(ComputeConfig::AUTO, 2, 2, 4, kTwoGpus, true);
  EXPECT_EQ(a.device, Device::cuda(0));
  EXPECT_EQ(a.note, "compute.device AUTO: CUDA device 0 of 2; 4 local ranks share 2 CUDA device(s) (compute.share_gpus)");
  EXPECT_FALSE(choose_device(ComputeConfig::CUDA, 1, 1, 2, kTwoGpus, true).shared);
  // No device is still no device.
  EXPECT_EQ(choose_device(ComputeConfig::AUTO, 0, 0, 2, kNoDriver, true).device, Device::cpu());
}

TEST(DeviceChoice, CpuIsTheCpu) {
  EXPECT_EQ(choose_device(ComputeConfig::CPU, 0, 0, 1, kTwoGpus).device, Device::cpu());
}

TEST(DeviceChoice, CudaWithoutAUsableGpuNamesTheRankAndTheReason) {
  expect_config_error(
      [] { choose_device(ComputeConfig::CUDA, 7, 0, 1, kNoDriver); },
      "rank 7: compute.device = CUDA, but no usable CUDA driver (cudaErrorInsufficientDriver");
  expect_config_error([] { choose_device(ComputeConfig::CUDA, 3, 2, 3, kTwoGpus); },
                                          "rank 3: compute.device = CUDA, but this node shows 2 CUDA device(s) for 3 local ranks");
  EXPECT_EQ(choose_device(ComputeConfig::CUDA, 1, 1, 2, kTwoGpus).device, Device::cuda(1));
}

TEST(DeviceChoice, RequestNames) {
  EXPECT_EQ(device_request_name(ComputeConfig::AUTO), "AUTO");
  EXPECT_EQ(device_request_name(ComputeConfig::CUDA), "CUDA");
}

}  // namespace
}  // namespace mp

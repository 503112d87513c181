// What of the staged MPI communicator (comm/mpi/staged_communicator.h) runs
// without a GPU: create() refuses, with a ConfigError that says why, a build
// without CUDA, a device that is not CUDA and a CUDA device that is not
// there. Its collectives are tested on a GPU, on 2 ranks, in
// tests/gpu/test_gpu_staged.cc.
#include <gtest/gtest.h>

#include <string>

#include "comm/mpi/staged_communicator.h"
#include "core/device.h"
#include "core/error.h"
#include "mp/config.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::contains;
using testing::error_of;

// No inner communicator is needed: the device is checked first, so no MPI.
std::string create_error(Device device) {
  return error_of<ConfigError>([&] { StagedMpiCommunicator::create(nullptr, device); });
}

TEST(StagedMpiCommunicator, CreateSaysWhyItCannotRun) {
#if !MP_WITH_CUDA
  const std::string e = create_error(Device::cuda(0));
  EXPECT_TRUE(contains(e, "moves CUDA tensors (cuda:0) through host memory, but mp was built without CUDA")) << e;
  EXPECT_TRUE(contains(create_error(Device::cpu()), "mp was built without CUDA"));
#else
  const std::string cpu = create_error(Device::cpu());
  EXPECT_TRUE(contains(cpu, "the staged MPI communicator is for CUDA memory, got cpu")) << cpu;
  const CudaInfo info = cuda_info();
  if (info.device_count == 0) {
    const std::string e = create_error(Device::cuda(0));
    EXPECT_TRUE(contains(e, "needs cuda:0, but no CUDA device is usable: " + info.unavailable_reason)) << e;
  } else {
    const std::string e = create_error(Device::cuda(info.device_count));
    EXPECT_TRUE(contains(e, "CUDA device(s) exist")) << e;
    EXPECT_TRUE(contains(error_of<EnforceError>([] { StagedMpiCommunicator::create(nullptr, Device::cuda(0)); }),
                         "needs an inner MpiCommunicator, got none"));
  }
#endif
}

}  // namespace
}  // namespace mp

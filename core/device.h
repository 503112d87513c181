// core/device.h: where memory lives and work runs: the CPU or one CUDA
// device. A CUDA build must start on a machine with no GPU or no driver and
// run its CPU paths; cuda_info() says why CUDA is unavailable.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

#include "core/host_wait.h"

namespace mp {

enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static constexpr Device cpu() { return Device{}; }
  static constexpr Device cuda(int i) { return Device{DeviceType::kCUDA, i}; }
  constexpr bool is_cpu() const { return type == DeviceType::kCPU; }
  constexpr bool is_cuda() const { return type == DeviceType::kCUDA; }
  friend constexpr bool operator==(Device, Device) = default;
};

std::string to_string(Device d);  // "cpu", "cuda:1"
std::ostream& operator<<(std::ostream& os, Device d);

struct CudaInfo {
  int device_count = 0;
  std::string unavailable_reason;  // why device_count is 0; empty otherwise
};

// Never throws. device_count is 0 in CPU-only builds, without a driver
// (cudaErrorInsufficientDriver) and without devices.
CudaInfo cuda_info();

// Makes `d` current for the calling thread (cudaSetDevice); no-op for CPU.
void set_current_device(Device d);

// Waits until every stream of CUDA device `d` is idle, ignoring errors: for
// owners of buffers that queued device work may still read, before they
// free them. No-op for CPU. Bounded (Note [Bounded host waits] in
// core/host_wait.h): at most `timeout`, and not at all once streams were
// abandoned (core/stream.h); a device still busy after `timeout` is
// reported on stderr, streams are abandoned, and the caller goes on.
void wait_for_device_idle(Device d, std::chrono::milliseconds timeout = kDefaultWaitTimeout) noexcept;

// MP_CUDA_SYNC=1: the debug mode in which CUDA ops synchronise after every
// kernel, so a device fault throws CudaError naming the kernel that caused
// it rather than a later call (the engine's ops, kernels/ops.h, and the
// CUDA GPT's).
// Read once; a value other than 0 or 1 is a ConfigError.
bool cuda_sync_each_op();

// One line for logs: "cpu (2 hardware threads)" or
// "cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB)".
std::string describe_device(Device d);

}  // namespace mp

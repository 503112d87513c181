// core/cuda_host_word.h: 32-bit words of pinned host memory, mapped into
// the device's address space, that host threads write and CUDA streams wait
// for on the device (cuStreamWaitValue32). A stream can so wait for
// progress that only a host thread sees (an MPI collective) without a CUDA
// host function blocking CUDA's callback thread.
//
// Note [Device waits on host words]
// - wait_on(stream, v): work submitted to the stream afterwards runs once
//   the word, compared as cuStreamWaitValue32's cyclic greater-or-equal
//   does ((int32_t)(word - v) >= 0), has reached v. Nothing blocks on the
//   host. The writer only ever raises the word, in that cyclic order.
// - The driver API is reached through the runtime's entry-point lookup
//   (cudaGetDriverEntryPointByVersion, version 11.7, the v2 stream memory
//   operations), so mp links no libcuda. supported() says whether a device
//   can do it: the v2 entry point exists (the v2 operations are on by
//   default on every platform; CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1
//   describes the old v1 operations, which a driver leaves off unless
//   loaded with NVreg_EnableStreamMemOPs=1, and is no test for v2), the
//   device maps host memory, and a probe on a stream of the device passes:
//   a wait already satisfied passes, and a wait for a word the host raises
//   from 0 to 1 after it was enqueued passes within 1 s (some virtualised
//   drivers never show the device a later host write).
// - CUDA does not see these waits as dependencies and may serialise
//   streams behind one that waits (its hardware queues are shared when a
//   process has many streams). So the writer of a word must never need work
//   queued on the device after the wait to make progress; comm/mpi/
//   staged_communicator.h says why the staged backend never does.
// - Words come from pages that are allocated once and never freed
//   (cudaHostAlloc, portable and mapped; a word per 64-byte line): freeing
//   pinned memory may synchronise the device, and a stream abandoned while
//   it waits may read its word until the process ends. A HostWord returns
//   its word for reuse when destroyed, unless leak() kept it out.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "core/device.h"

namespace mp {

class HostWord {
 public:
  // Whether streams of `device` can wait on host words; if not, `why` (if
  // given) says why. Cached per device after the first call. Never throws.
  static bool supported(Device device, std::string* why = nullptr) noexcept;

  // A word for streams of `device`, set to 0. Throws CudaError when the
  // device cannot wait on host words (supported() is false).
  explicit HostWord(Device device);
  ~HostWord();
  HostWord(const HostWord&) = delete;
  HostWord& operator=(const HostWord&) = delete;

  std::atomic<uint32_t>& value() const { return *value_; }
  // Work submitted to `stream` (a stream of the word's device) after this
  // call waits, on the device, until the word has reached `at_least`.
  void wait_on(cudaStream_t stream, uint32_t at_least) const;
  // Keeps the word out of the pool for good: a stream may still wait on it.
  void leak() noexcept { leaked_ = true; }

 private:
  Device device_;
  std::atomic<uint32_t>* value_ = nullptr;
  uintptr_t device_address_ = 0;  // the word as the device sees it
  bool leaked_ = false;
};

}  // namespace mp

// core/cuda_stream.h: the CUDA side of core/stream.h. A CudaStream owns
// a non-blocking cudaStream_t on one device; its events are cudaEvent_t
// created without timing, except record_timed()'s. Semantics: Note [Stream and event semantics].
#pragma once

#include <cuda_runtime_api.h>

#include "core/stream.h"

namespace mp {

// Makes a CUDA device current on the calling thread for a scope and
// restores the previous one (every thread that touches a device sets it
// first: core/device.h).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(Device device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

class CudaStream final : public Stream {
 public:
  CudaStream(Device device, std::string name);
  ~CudaStream() override;

  Device device() const override { return device_; }
  Event record() override;
  Event record_timed() override;
  void wait(const Event& event) override;
  // cudaLaunchHostFunc. An exception inside `task` is caught on the CUDA
  // callback thread and kept as the stream's failure: later host tasks
  // skip, and events recorded after it rethrow it (Note [Stream and event
  // semantics]).
  void host_task(std::function<void()> task, TaskName name = {}) override;
  void rethrow_failure() override;
  cudaStream_t handle() const { return stream_; }

  // The host tasks' failure, shared with the callbacks and the events.
  struct Failure;

 private:
  Device device_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<Failure> failure_;
};

// The cudaStream_t of `stream`; throws EnforceError when it is not a CUDA stream.
cudaStream_t cuda_handle(Stream* stream);

}  // namespace mp

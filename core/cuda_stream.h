// core/cuda_stream.h: the CUDA side of core/stream.h. A CudaStream owns
// a non-blocking cudaStream_t on one device; its events are cudaEvent_t
// created without timing, except record_timed()'s. Semantics: Note [Stream and event semantics].
// Every host wait on them is bounded: Note [Bounded host waits] in
// core/host_wait.h.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <string>

#include "core/host_wait.h"
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
  // `wait_timeout`: StreamOptions::wait_timeout.
  CudaStream(Device device, std::string name, std::chrono::milliseconds wait_timeout = kDefaultWaitTimeout);
  // Waits for the stream's work at most wait_timeout() (not at all once
  // streams were abandoned, core/stream.h), then destroys it. Work still
  // pending then is reported on stderr and the stream is left as it is
  // (not destroyed), and streams are abandoned.
  ~CudaStream() override;

  Device device() const override { return device_; }
  Event record() override;
  Event record_timed() override;
  void wait(const Event& event) override;
  // cudaLaunchHostFunc. An exception inside `task` is caught on the CUDA
  // callback thread and kept as the stream's failure: later host tasks
  // skip, and events recorded after it rethrow it (Note [Stream and event
  // semantics]). CUDA may run the host tasks of every stream of the process
  // on one thread, one at a time: `task` must not wait for anything that
  // another thread or stream has yet to do (it would hold up every other
  // host task meanwhile, and two such waits can wait for each other).
  void host_task(std::function<void()> task, TaskName name = {}) override;
  void rethrow_failure() override;
  cudaStream_t handle() const { return stream_; }
  // How long a host thread waits for this stream's events.
  std::chrono::milliseconds wait_timeout() const { return wait_timeout_; }

  // The host tasks' failure, shared with the callbacks and the events.
  struct Failure;

 private:
  Event record_event(bool timing);

  Device device_;
  std::chrono::milliseconds wait_timeout_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<Failure> failure_;
  std::atomic<uint64_t> recorded_{0};  // events recorded so far: an event's number in messages
};

// The cudaStream_t of `stream`; throws EnforceError when it is not a CUDA stream.
cudaStream_t cuda_handle(Stream* stream);

// Bounded waits on raw CUDA handles (Note [Bounded host waits]), by polling
// cudaEventQuery / cudaStreamQuery: cudaSuccess once the event has
// completed (the stream is idle), cudaErrorNotReady when `timeout` passed
// first, or the error CUDA reported.
cudaError_t query_event_until(cudaEvent_t event, std::chrono::nanoseconds timeout);
cudaError_t query_stream_until(cudaStream_t stream, std::chrono::nanoseconds timeout);
// The same, throwing CudaError: at the deadline one that says `what` did
// not complete within the timeout (after abandon_cpu_streams()), or the
// error CUDA reported.
void synchronize_event(cudaEvent_t event, std::chrono::nanoseconds timeout, const std::string& what);
void synchronize_stream(cudaStream_t stream, std::chrono::nanoseconds timeout, const std::string& what);

}  // namespace mp

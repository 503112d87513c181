#include "core/cuda_stream.h"

#include <thread>

#include "core/error_cuda.h"

namespace mp {

CudaDeviceGuard::CudaDeviceGuard(Device device) {
  MP_CHECK_CUDA(cudaGetDevice(&previous_));
  if (previous_ != device.index) MP_CHECK_CUDA(cudaSetDevice(device.index));
}

CudaDeviceGuard::~CudaDeviceGuard() { (void)cudaSetDevice(previous_); }

namespace {

class CudaEvent final : public EventImpl {
 public:
  CudaEvent(Device device, cudaStream_t stream, bool timing = false) : device_(device) {
    CudaDeviceGuard guard(device);
    MP_CHECK_CUDA(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
    MP_CHECK_CUDA(cudaEventRecord(event_, stream));
  }
  ~CudaEvent() override { (void)cudaEventDestroy(event_); }

  Device device() const override { return device_; }
  bool query() override {
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) return false;
    MP_CHECK_CUDA(err);
    return true;
  }
  void synchronize() override { MP_CHECK_CUDA(cudaEventSynchronize(event_)); }
  bool wait_for(std::chrono::nanoseconds timeout) override {
    // Polls: cudaEventSynchronize has no timeout.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!query()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  }
  double seconds_since(const EventImpl& start) const override {
    const auto* s = dynamic_cast<const CudaEvent*>(&start);
    MP_ENFORCE(s != nullptr, "elapsed time between a CUDA event and a ", to_string(start.device()), " event");
    float ms = 0;
    MP_CHECK_CUDA(cudaEventElapsedTime(&ms, s->event_, event_));  // both must be timed and complete
    return ms / 1000.0;
  }
  cudaEvent_t handle() const { return event_; }

 private:
  Device device_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace

CudaStream::CudaStream(Device device, std::string name) : Stream(std::move(name)), device_(device) {
  MP_ENFORCE(device.is_cuda(), "CudaStream on ", device);
  CudaDeviceGuard guard(device);
  MP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaStream::~CudaStream() {
  (void)cudaStreamSynchronize(stream_);
  (void)cudaStreamDestroy(stream_);
}

Event CudaStream::record() { return Event(std::make_shared<CudaEvent>(device_, stream_)); }

Event CudaStream::record_timed() { return Event(std::make_shared<CudaEvent>(device_, stream_, true)); }

namespace {
void CUDART_CB run_host_task(void* data) {
  std::unique_ptr<std::function<void()>> task(static_cast<std::function<void()>*>(data));
  (*task)();
}
}  // namespace

void CudaStream::host_task(std::function<void()> task) {
  MP_ENFORCE(task != nullptr, "empty host task on stream '", name(), "'");
  auto* heap = new std::function<void()>(std::move(task));
  const cudaError_t err = cudaLaunchHostFunc(stream_, run_host_task, heap);
  if (err != cudaSuccess) delete heap;
  MP_CHECK_CUDA(err);
}

void CudaStream::wait(const Event& event) {
  EventImpl* impl = event.impl();
  if (impl == nullptr) return;
  if (auto* cuda_event = dynamic_cast<CudaEvent*>(impl)) {
    MP_CHECK_CUDA(cudaStreamWaitEvent(stream_, cuda_event->handle(), 0));
    return;
  }
  // A CPU event: only a finished one can be waited for without a host sync.
  MP_ENFORCE(impl->query(), "CUDA stream '", name(),
             "' cannot wait for an unfinished CPU event without blocking the host; "
             "synchronize the event on the host first");
  impl->synchronize();  // rethrows the CPU work's failure, if any
}

cudaStream_t cuda_handle(Stream* stream) {
  auto* cuda = dynamic_cast<CudaStream*>(stream);
  MP_ENFORCE(cuda != nullptr, "a CUDA stream is required, got ",
             stream ? to_string(stream->device()) + " stream '" + stream->name() + "'"
                    : std::string("no stream"));
  return cuda->handle();
}

}  // namespace mp

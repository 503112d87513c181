#include "core/cuda_stream.h"

#include <mutex>
#include <thread>

#include "core/error_cuda.h"

namespace mp {

// Host tasks are numbered in submission order (host side); the first that
// throws keeps its number and error. An event recorded after task k
// rethrows the failure of any task numbered k or below.
struct CudaStream::Failure {
  std::mutex mu;
  std::exception_ptr error;
  uint64_t failed_task = 0;  // 0: none
  uint64_t submitted = 0;    // host tasks enqueued so far (host thread only)

  std::exception_ptr error_up_to(uint64_t task) {
    std::lock_guard<std::mutex> lock(mu);
    return failed_task != 0 && failed_task <= task ? error : nullptr;
  }
};

CudaDeviceGuard::CudaDeviceGuard(Device device) {
  MP_CHECK_CUDA(cudaGetDevice(&previous_));
  if (previous_ != device.index) MP_CHECK_CUDA(cudaSetDevice(device.index));
}

CudaDeviceGuard::~CudaDeviceGuard() { (void)cudaSetDevice(previous_); }

namespace {

class CudaEvent final : public EventImpl {
 public:
  // `failure` (may be null): the recording stream's host-task failures, of
  // which those up to task `after_task` are this event's.
  CudaEvent(Device device, cudaStream_t stream, bool timing, std::shared_ptr<CudaStream::Failure> failure,
            uint64_t after_task)
      : device_(device), failure_(std::move(failure)), after_task_(after_task) {
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
  void synchronize() override {
    MP_CHECK_CUDA(cudaEventSynchronize(event_));
    rethrow_task_failure();
  }
  bool wait_for(std::chrono::nanoseconds timeout) override {
    // Polls: cudaEventSynchronize has no timeout.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!query()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    rethrow_task_failure();
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
  void rethrow_task_failure() const {
    if (failure_ == nullptr) return;
    if (std::exception_ptr e = failure_->error_up_to(after_task_)) std::rethrow_exception(e);
  }

  Device device_;
  cudaEvent_t event_ = nullptr;
  std::shared_ptr<CudaStream::Failure> failure_;
  uint64_t after_task_ = 0;
};

}  // namespace

CudaStream::CudaStream(Device device, std::string name)
    : Stream(std::move(name)), device_(device), failure_(std::make_shared<Failure>()) {
  MP_ENFORCE(device.is_cuda(), "CudaStream on ", device);
  CudaDeviceGuard guard(device);
  MP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaStream::~CudaStream() {
  (void)cudaStreamSynchronize(stream_);
  (void)cudaStreamDestroy(stream_);
}

Event CudaStream::record() {
  return Event(std::make_shared<CudaEvent>(device_, stream_, false, failure_, failure_->submitted));
}

Event CudaStream::record_timed() {
  return Event(std::make_shared<CudaEvent>(device_, stream_, true, failure_, failure_->submitted));
}

namespace {

// One host task on its way through cudaLaunchHostFunc.
struct HostTask {
  std::function<void()> task;
  TaskName name;
  uint64_t number = 0;
  std::string stream;
  std::shared_ptr<CudaStream::Failure> failure;
};

// On CUDA's callback thread: nothing may escape (it would end the process).
void CUDART_CB run_host_task(void* data) noexcept {
  std::unique_ptr<HostTask> t(static_cast<HostTask*>(data));
  {
    std::lock_guard<std::mutex> lock(t->failure->mu);
    if (t->failure->failed_task != 0) return;  // the stream failed before: skip
  }
  try {
    t->task();
  } catch (...) {
    std::exception_ptr e = task_error(std::current_exception(), t->name, t->stream);
    std::lock_guard<std::mutex> lock(t->failure->mu);
    if (t->failure->failed_task == 0) {
      t->failure->failed_task = t->number;
      t->failure->error = std::move(e);
    }
  }
}

}  // namespace

void CudaStream::host_task(std::function<void()> task, TaskName name) {
  MP_ENFORCE(task != nullptr, "empty host task on stream '", this->name(), "'");
  auto heap =
      std::make_unique<HostTask>(HostTask{std::move(task), name, failure_->submitted + 1, this->name(), failure_});
  MP_CHECK_CUDA(cudaLaunchHostFunc(stream_, run_host_task, heap.get()));
  (void)heap.release();  // run_host_task owns it now
  ++failure_->submitted;
}

void CudaStream::rethrow_failure() {
  if (std::exception_ptr e = failure_->error_up_to(~uint64_t{0})) std::rethrow_exception(e);
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

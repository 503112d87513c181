#include "core/cuda_stream.h"

#include <functional>
#include <mutex>

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

// Where an event was recorded, for the error of a wait that timed out.
struct EventOrigin {
  std::string stream;
  uint64_t number = 0;  // 1-based, per stream
  std::chrono::milliseconds wait_timeout{kDefaultWaitTimeout};
};

class CudaEvent final : public EventImpl {
 public:
  // `failure` (may be null): the recording stream's host-task failures, of
  // which those up to task `after_task` are this event's.
  CudaEvent(Device device, cudaStream_t stream, bool timing, std::shared_ptr<CudaStream::Failure> failure,
            uint64_t after_task, EventOrigin origin)
      : device_(device), failure_(std::move(failure)), after_task_(after_task), origin_(std::move(origin)) {
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
  // Bounded by the recording stream's wait timeout (Note [Bounded host waits]).
  void synchronize() override {
    if (wait_for(origin_.wait_timeout)) return;
    abandon_cpu_streams();
    MP_THROW(CudaError, "event #", origin_.number, " of CUDA stream '", origin_.stream, "' (", device_,
             ") did not complete within ", seconds_text(origin_.wait_timeout),
             " s: work on that stream before it has not finished (a kernel that does not end, or a wait for a "
             "collective that does not complete)");
  }
  bool wait_for(std::chrono::nanoseconds timeout) override {
    if (!poll_until([this] { return query(); }, timeout)) return false;
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
  EventOrigin origin_;
};

cudaError_t query_until(const std::function<cudaError_t()>& query, std::chrono::nanoseconds timeout) {
  cudaError_t last = cudaErrorNotReady;
  (void)poll_until(
      [&] {
        last = query();
        return last != cudaErrorNotReady;
      },
      timeout);
  return last;
}

}  // namespace

cudaError_t query_event_until(cudaEvent_t event, std::chrono::nanoseconds timeout) {
  return query_until([event] { return cudaEventQuery(event); }, timeout);
}

cudaError_t query_stream_until(cudaStream_t stream, std::chrono::nanoseconds timeout) {
  return query_until([stream] { return cudaStreamQuery(stream); }, timeout);
}

namespace {

void check_bounded_wait(cudaError_t err, const char* call, std::chrono::nanoseconds timeout, const std::string& what) {
  if (err == cudaErrorNotReady) {
    abandon_cpu_streams();
    MP_THROW(CudaError, what, " did not complete within ", seconds_text(timeout), " s");
  }
  if (err != cudaSuccess) {
    MP_THROW(CudaError, "waiting for ", what, ": ", call, " failed: ", cudaGetErrorName(err), " (",
             cudaGetErrorString(err), ")");
  }
}

}  // namespace

void synchronize_event(cudaEvent_t event, std::chrono::nanoseconds timeout, const std::string& what) {
  check_bounded_wait(query_event_until(event, timeout), "cudaEventQuery", timeout, what);
}

void synchronize_stream(cudaStream_t stream, std::chrono::nanoseconds timeout, const std::string& what) {
  check_bounded_wait(query_stream_until(stream, timeout), "cudaStreamQuery", timeout, what);
}

CudaStream::CudaStream(Device device, std::string name, std::chrono::milliseconds wait_timeout)
    : Stream(std::move(name)), device_(device), wait_timeout_(wait_timeout), failure_(std::make_shared<Failure>()) {
  MP_ENFORCE(device.is_cuda(), "CudaStream on ", device);
  CudaDeviceGuard guard(device);
  MP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaStream::~CudaStream() {
  // Note [Bounded host waits]: its owner frees buffers that this stream's
  // work may use right after; wait for it, within bounds.
  const auto wait = cpu_streams_abandoned() ? std::chrono::milliseconds(0) : wait_timeout_;
  if (query_stream_until(stream_, wait) == cudaErrorNotReady) {
    abandon_cpu_streams();
    report_abandoned_wait("the work of CUDA stream '" + name() + "' (" + to_string(device_) + ")", wait,
                          "the stream is left as it is");
    return;
  }
  (void)cudaStreamDestroy(stream_);
}

Event CudaStream::record_event(bool timing) {
  EventOrigin origin{name(), ++recorded_, wait_timeout_};
  return Event(std::make_shared<CudaEvent>(device_, stream_, timing, failure_, failure_->submitted, std::move(origin)));
}

Event CudaStream::record() { return record_event(false); }

Event CudaStream::record_timed() { return record_event(true); }

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

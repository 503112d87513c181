// core/stream.h: ordered queues of work and the events that mark points in
// them. On CUDA a Stream is a cudaStream_t and an Event a cudaEvent_t; on the
// CPU a Stream is a worker thread running submitted tasks in order, so that
// communication and computation overlap on CPU exactly as on GPU.
//
// Note [Stream and event semantics]
// - Work submitted to one stream runs in submission order; work on different
//   streams may run concurrently.
// - Stream::record() returns an Event that completes when all work submitted
//   to that stream before the call has completed.
// - Stream::wait(e) makes work submitted later wait for e. A CPU stream's
//   worker blocks on e; a CUDA stream waits on the device
//   (cudaStreamWaitEvent) with no host sync. A CUDA stream cannot wait for an
//   unfinished CPU event without blocking the host, so that throws.
// - Event::synchronize() blocks the calling thread until completion.
// - Failure: a CPU task that throws marks its stream failed. Later tasks on
//   it are skipped, and every event recorded after the failure, as well as
//   Stream::synchronize(), rethrows the first error. A stream that waits on
//   a failed event fails in the same way, so bad inputs never feed later
//   work. CUDA errors surface from the CUDA call that reports them.
// - Stream::host_task(f) runs f on a host thread once the work submitted
//   before it has completed, and work submitted after it waits for f (CPU:
//   a task of the worker; CUDA: cudaLaunchHostFunc, so f must not call CUDA).
// - Timing: record_timed() returns an event that also notes when it
//   completed; elapsed_seconds(a, b) is the time between two completed
//   timed events of one device (CPU: the worker's clock; CUDA:
//   cudaEventElapsedTime).
//
// Note [Order torture]
// With the environment variable MP_ORDER_TORTURE=1, every CPU stream worker
// (compute and communication threads alike) sleeps a random 0 to 300 us
// before about one task in four, so that work on different streams
// interleaves in orders the schedule would rarely produce by itself. Only
// ordering through events is then guaranteed; a missing event shows up as
// changed bits or a failure in the tests that run under it (tests/
// CMakeLists.txt, label "torture"). Off by default: one load of a flag per
// task.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/device.h"

namespace mp {

class EventImpl {
 public:
  virtual ~EventImpl() = default;
  virtual Device device() const = 0;
  virtual bool query() = 0;        // true once complete (failed counts as complete)
  virtual void synchronize() = 0;  // blocks; rethrows a failure
  // Blocks at most `timeout`: true once complete (rethrowing a failure),
  // false if still pending.
  virtual bool wait_for(std::chrono::nanoseconds timeout) = 0;
  // Seconds from `start` (a completed timed event of the same kind and
  // device) to this completed timed event.
  virtual double seconds_since(const EventImpl& start) const = 0;
};

// A shared handle; a default-constructed Event is already complete.
class Event {
 public:
  Event() = default;
  explicit Event(std::shared_ptr<EventImpl> impl) : impl_(std::move(impl)) {}
  bool query() const { return !impl_ || impl_->query(); }
  void synchronize() const {
    if (impl_) impl_->synchronize();
  }
  bool wait_for(std::chrono::nanoseconds timeout) const { return !impl_ || impl_->wait_for(timeout); }
  EventImpl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<EventImpl> impl_;
};

// Seconds between two completed events of one stream kind, both from
// record_timed(); throws EnforceError otherwise.
double elapsed_seconds(const Event& start, const Event& end);

class Stream {
 public:
  // A CPU stream (worker thread) or a new non-blocking CUDA stream.
  static std::unique_ptr<Stream> create(Device device, std::string name);

  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  virtual Device device() const = 0;
  virtual Event record() = 0;
  // An event that also notes when it completed (for elapsed_seconds).
  virtual Event record_timed() { return record(); }
  virtual void wait(const Event& event) = 0;
  // Runs `task` on a host thread in stream order (Note [Stream and event
  // semantics]); it must not throw on CUDA streams (an exception there ends
  // the process), and on CPU streams it fails the stream.
  virtual void host_task(std::function<void()> task) = 0;
  void synchronize() { record().synchronize(); }
  const std::string& name() const { return name_; }

 protected:
  explicit Stream(std::string name) : name_(std::move(name)) {}

 private:
  std::string name_;
};

// After a collective timed out, a communication thread may be blocked in
// the MPI library for good (its peer died or hangs). abandon_cpu_streams()
// (Work::wait calls it on a timeout) makes teardown give up on such work:
// a CpuStream's destructor drops what has not started and detaches a
// worker that is still inside a task instead of joining it, and
// communicators and the engine skip their final synchronization. The
// process is expected to end soon (mp_worker aborts the job); nothing
// waits forever on the way there.
void abandon_cpu_streams() noexcept;
bool cpu_streams_abandoned() noexcept;

// Whether MP_ORDER_TORTURE=1 was set when the first stream started (Note
// [Order torture]).
bool order_torture() noexcept;

class CpuStream final : public Stream {
 public:
  explicit CpuStream(std::string name = "cpu");
  ~CpuStream() override;  // runs what was submitted, then joins the worker (see abandon_cpu_streams)

  Device device() const override { return Device::cpu(); }
  Event record() override;
  Event record_timed() override { return record(); }  // every CPU event notes its time
  void wait(const Event& event) override;
  void host_task(std::function<void()> task) override { submit(std::move(task)); }

  // Runs `task` on the worker after everything submitted before it.
  void submit(std::function<void()> task);

 private:
  class CpuEvent;
  struct Item {
    std::function<void()> task;         // empty for an event marker
    std::shared_ptr<CpuEvent> event;    // set for an event marker
  };
  // Shared with the worker, so a detached worker never touches freed memory.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> queue;
    bool stopping = false;
    bool busy = false;         // the worker is inside a task
    std::exception_ptr error;  // first failure; touched only by the worker
  };
  void push(Item item);
  static void run(State& state);

  std::shared_ptr<State> state_;
  std::thread worker_;
};

}  // namespace mp

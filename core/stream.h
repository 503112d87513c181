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
// - Event::synchronize() blocks the calling thread until completion; on a
//   CUDA event at most the stream's StreamOptions::wait_timeout, then it
//   throws (Note [Bounded host waits] in core/host_wait.h).
// - Failure: a task that throws (a CPU stream's task, or a host_task on
//   either kind) marks its stream failed; the exception never ends the
//   process. Its error is the task's own exception with " [op 'OP' of unit
//   'U' on stream 'S']" added (core/error.h: the same type, marked
//   from_stream_task()). Later host tasks on the stream are skipped, and
//   every event recorded after the failure, Stream::synchronize() and
//   Stream::rethrow_failure() rethrow that first error. A CPU stream that
//   waits on a failed event fails in the same way, so bad inputs never feed
//   later work, unless it was made with StreamOptions::inherits_failures
//   false (communication threads): then, like a CUDA stream, whose device
//   work goes on, it only waits, and its owner finds the failure where it
//   rethrows (the engine at every call and at every step's agreement).
//   CUDA errors surface from the CUDA call that reports them.
// - Stream::host_task(f) runs f on a host thread once the work submitted
//   before it has completed, and work submitted after it waits for f (CPU:
//   a task of the worker; CUDA: cudaLaunchHostFunc, so f must not call CUDA).
//   What f reads must belong to the stream's order, never to the host
//   thread's: the host has usually moved on by the time f runs (Note [Order
//   torture] makes sure of it in the tests).
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
// CMakeLists.txt, label "torture"). A stream created with
// StreamOptions::lags_under_torture (the engine's compute stream) also
// sleeps 2 ms each time it takes up work after its queue ran dry, so the
// host thread enqueues far ahead of it, as it does of a GPU: a stream task
// that reads host state the host has since changed then fails for sure.
// Off by default: one load of a flag per task.
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
#include "core/host_wait.h"

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

// What a task is, for the error it may raise: an op name and, for a
// model's op, the unit it computes. Both strings must outlive the task
// (literals, or names the model holds).
struct TaskName {
  const char* op = "host task";
  const char* unit = nullptr;  // null: not a unit's op
};
// " [op 'OP' of unit 'U' on stream 'S']": what a failed task's error adds.
std::string task_context(TaskName name, const std::string& stream);
// The error a task that threw `error` fails its stream with: `error` with
// task_context added (from_stream_task()), or `error` itself when another
// stream's task already named it (a failed event waited for).
std::exception_ptr task_error(std::exception_ptr error, TaskName name, const std::string& stream);

struct StreamOptions {
  // Note [Order torture]: pauses when work resumes after an idle spell.
  bool lags_under_torture = false;
  // A CPU stream that waits on a failed event fails too (Note [Stream and
  // event semantics]). False: the wait only orders, as a CUDA stream's
  // does, and the stream goes on. A communication thread is made so: it
  // keeps its collectives in step with the peers after the compute it waits
  // for failed, so no peer waits for it, and the failure reaches every rank
  // through the owner's agreement (Note [A failed step] in runtime/engine.h).
  bool inherits_failures = true;
  // CUDA streams: how long a host thread waits for one of the stream's
  // events (Event::synchronize, Stream::synchronize, the destructor's
  // final wait) before it throws CudaError naming the stream, its device
  // and the event (Note [Bounded host waits] in core/host_wait.h). The
  // engine and the communicators pass their communicator's timeout. CPU
  // streams are host threads whose waits end with the work they wait for;
  // what bounds them is the collectives' timeout (comm/work.h).
  std::chrono::milliseconds wait_timeout{kDefaultWaitTimeout};
};

class Stream {
 public:
  // A CPU stream (worker thread) or a new non-blocking CUDA stream.
  static std::unique_ptr<Stream> create(Device device, std::string name, StreamOptions options = {});

  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  virtual Device device() const = 0;
  virtual Event record() = 0;
  // An event that also notes when it completed (for elapsed_seconds).
  virtual Event record_timed() { return record(); }
  virtual void wait(const Event& event) = 0;
  // Runs `task` on a host thread in stream order (Note [Stream and event
  // semantics]). If it throws, the stream fails with its error, named by
  // `name`; it never ends the process.
  virtual void host_task(std::function<void()> task, TaskName name = {}) = 0;
  // Rethrows the stream's first failure (Note [Stream and event semantics]),
  // if any; returns otherwise. Does not wait.
  virtual void rethrow_failure() = 0;
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
  explicit CpuStream(std::string name = "cpu", StreamOptions options = {});
  ~CpuStream() override;  // runs what was submitted, then joins the worker (see abandon_cpu_streams)

  Device device() const override { return Device::cpu(); }
  Event record() override;
  Event record_timed() override { return record(); }  // every CPU event notes its time
  void wait(const Event& event) override;
  void host_task(std::function<void()> task, TaskName name = {}) override { submit(std::move(task), name); }
  void rethrow_failure() override;

  // Runs `task` on the worker after everything submitted before it.
  void submit(std::function<void()> task, TaskName name = {});
  // The same, but `task` runs even when the stream failed before it (a
  // normal task is then skipped): for an owner's bookkeeping that must
  // happen whatever became of the work before it, such as telling a device
  // that waits for a collective that the collective is over (Note [Staged
  // collectives] in comm/mpi/staged_communicator.h). It learns the earlier
  // failure from the events it checks. If it throws, the stream fails as
  // with any task (keeping an earlier failure as the first).
  void submit_always(std::function<void()> task, TaskName name = {});

 private:
  class CpuEvent;
  struct Item {
    std::function<void()> task;         // empty for an event marker
    std::shared_ptr<CpuEvent> event;    // set for an event marker
    TaskName name;
    bool always = false;  // runs even after a failure (submit_always)
  };
  // Shared with the worker, so a detached worker never touches freed memory.
  struct State {
    std::string name;  // the stream's
    bool lags = false;  // StreamOptions::lags_under_torture
    bool inherits_failures = true;  // StreamOptions::inherits_failures
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> queue;
    bool stopping = false;
    bool busy = false;         // the worker is inside a task
    std::exception_ptr error;  // first failure; written by the worker under mu
  };
  void push(Item item);
  static void run(State& state);

  std::shared_ptr<State> state_;
  std::thread worker_;
};

}  // namespace mp

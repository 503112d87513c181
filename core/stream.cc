#include "core/stream.h"

#include <atomic>
#include <cstdlib>
#include <random>

#include "core/error.h"
#include "core/parallel.h"
#include "core/stop_signals.h"
#include "mp/config.h"
#if MP_WITH_CUDA
#include "core/cuda_stream.h"
#endif

namespace mp {

class CpuStream::CpuEvent final : public EventImpl {
 public:
  Device device() const override { return Device::cpu(); }

  bool query() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  void synchronize() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }

  bool wait_for(std::chrono::nanoseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return done_; })) return false;
    if (error_) std::rethrow_exception(error_);
    return true;
  }

  double seconds_since(const EventImpl& start) const override {
    const auto* s = dynamic_cast<const CpuEvent*>(&start);
    MP_ENFORCE(s != nullptr, "elapsed time between a CPU event and a ", to_string(start.device()), " event");
    std::scoped_lock lock(mu_, s->mu_);
    MP_ENFORCE(done_ && s->done_, "elapsed time of an event that has not completed");
    return std::chrono::duration<double>(at_ - s->at_).count();
  }

  void complete(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      at_ = std::chrono::steady_clock::now();
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::chrono::steady_clock::time_point at_;
  std::exception_ptr error_;
};

namespace {
std::atomic<bool> g_abandoned{false};
}  // namespace

void abandon_cpu_streams() noexcept { g_abandoned.store(true); }
bool cpu_streams_abandoned() noexcept { return g_abandoned.load(); }

bool order_torture() noexcept {
  static const bool on = [] {
    const char* v = std::getenv("MP_ORDER_TORTURE");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

namespace {

// Note [Order torture]: a random pause before about one task in four.
void torture_pause() {
  thread_local std::minstd_rand rng(std::random_device{}());
  const uint32_t r = static_cast<uint32_t>(rng());
  if ((r & 3u) != 0) return;
  std::this_thread::sleep_for(std::chrono::microseconds((r >> 2) % 300));
}

// Note [Order torture]: a lagging stream's pause when it resumes work.
constexpr auto kTortureLag = std::chrono::milliseconds(2);

}  // namespace

std::string task_context(TaskName name, const std::string& stream) {
  std::string out = " [op '";
  out += name.op != nullptr ? name.op : "?";
  out += "'";
  if (name.unit != nullptr) {
    out += " of unit '";
    out += name.unit;
    out += "'";
  }
  out += " on stream '" + stream + "']";
  return out;
}

double elapsed_seconds(const Event& start, const Event& end) {
  MP_ENFORCE(start.impl() != nullptr && end.impl() != nullptr, "elapsed time of a default-constructed event");
  return end.impl()->seconds_since(*start.impl());
}

CpuStream::CpuStream(std::string name, StreamOptions options)
    : Stream(name), state_(std::make_shared<State>()) {
  state_->name = std::move(name);
  state_->lags = options.lags_under_torture;
  state_->inherits_failures = options.inherits_failures;
  worker_ = std::thread([state = state_] {
    block_stop_signals_in_this_thread();  // Note [Signals and oneDNN]
    name_this_thread(state->name);
    run(*state);
  });
}

CpuStream::~CpuStream() {
  bool detach = false;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
    if (cpu_streams_abandoned()) {
      state_->queue.clear();  // nothing more starts
      detach = state_->busy;  // a task that may never return
    }
  }
  state_->cv.notify_all();
  if (detach) {
    worker_.detach();
  } else {
    worker_.join();
  }
}

void CpuStream::push(Item item) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    MP_ENFORCE(!state_->stopping, "submit to stream '", name(), "' while it is being destroyed");
    state_->queue.push_back(std::move(item));
  }
  state_->cv.notify_one();
}

void CpuStream::submit(std::function<void()> task, TaskName name) {
  MP_ENFORCE(task != nullptr, "empty task submitted to stream '", this->name(), "'");
  push(Item{std::move(task), nullptr, name, /*always=*/false});
}

void CpuStream::submit_always(std::function<void()> task, TaskName name) {
  MP_ENFORCE(task != nullptr, "empty task submitted to stream '", this->name(), "'");
  push(Item{std::move(task), nullptr, name, /*always=*/true});
}

Event CpuStream::record() {
  auto event = std::make_shared<CpuEvent>();
  push(Item{nullptr, event, {}, /*always=*/false});
  return Event(event);
}

void CpuStream::wait(const Event& event) {
  if (event.impl() == nullptr) return;
  // The worker blocks until the event completes; a failed event fails this
  // stream with the error that failed it (already named by its task), or,
  // without inherits_failures, counts as completed.
  if (state_->inherits_failures) {
    submit([event] { event.synchronize(); }, TaskName{"wait for an event"});
    return;
  }
  submit(
      [event] {
        try {
          event.synchronize();
        } catch (...) {  // its stream's owner reports it
        }
      },
      TaskName{"wait for an event"});
}

void CpuStream::rethrow_failure() {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    error = state_->error;
  }
  if (error) std::rethrow_exception(error);
}

std::exception_ptr task_error(std::exception_ptr error, TaskName name, const std::string& stream) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    if (e.from_stream_task()) return error;
  } catch (...) {
  }
  return with_context(error, task_context(name, stream), /*stream_task=*/true);
}

void CpuStream::run(State& st) {
  const bool torture = order_torture();
  bool idle = true;  // the queue ran dry before this item
  for (;;) {
    Item item;
    std::exception_ptr error;
    {
      std::unique_lock<std::mutex> lock(st.mu);
      st.busy = false;
      if (st.queue.empty()) idle = true;
      st.cv.wait(lock, [&] { return st.stopping || !st.queue.empty(); });
      if (st.queue.empty()) return;  // stopping, and everything submitted has run
      item = std::move(st.queue.front());
      st.queue.pop_front();
      st.busy = true;
      error = st.error;
    }
    if (torture) {
      if (st.lags && idle) std::this_thread::sleep_for(kTortureLag);
      torture_pause();
    }
    idle = false;
    if (item.event) {
      item.event->complete(error);
    } else if (!error || item.always) {
      try {
        item.task();
      } catch (...) {
        std::exception_ptr e = task_error(std::current_exception(), item.name, st.name);
        std::lock_guard<std::mutex> lock(st.mu);
        if (!st.error) st.error = std::move(e);
      }
    }
  }
}

std::unique_ptr<Stream> Stream::create(Device device, std::string name, StreamOptions options) {
  if (device.is_cpu()) return std::make_unique<CpuStream>(std::move(name), options);
#if MP_WITH_CUDA
  return std::make_unique<CudaStream>(device, std::move(name), options.wait_timeout);
#else
  MP_THROW(ConfigError, "stream '", name, "' on ", device, ": mp was built without CUDA");
#endif
}

}  // namespace mp

#include "runtime/stream.h"

#include "mp/config.h"
#include "runtime/error.h"
#if MP_WITH_CUDA
#include "runtime/cuda_stream.h"
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

  void complete(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

CpuStream::CpuStream(std::string name) : Stream(std::move(name)), worker_([this] { run(); }) {}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void CpuStream::push(Item item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    MP_ENFORCE(!stopping_, "submit to stream '", name(), "' while it is being destroyed");
    queue_.push_back(std::move(item));
  }
  cv_.notify_one();
}

void CpuStream::submit(std::function<void()> task) {
  MP_ENFORCE(task != nullptr, "empty task submitted to stream '", name(), "'");
  push(Item{std::move(task), nullptr});
}

Event CpuStream::record() {
  auto event = std::make_shared<CpuEvent>();
  push(Item{nullptr, event});
  return Event(event);
}

void CpuStream::wait(const Event& event) {
  if (event.impl() == nullptr) return;
  // The worker blocks until the event completes; a failed event fails this stream.
  submit([event] { event.synchronize(); });
}

void CpuStream::run() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything submitted has run
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    if (item.event) {
      item.event->complete(error_);
    } else if (!error_) {
      try {
        item.task();
      } catch (...) {
        error_ = std::current_exception();
      }
    }
  }
}

std::unique_ptr<Stream> Stream::create(Device device, std::string name) {
  if (device.is_cpu()) return std::make_unique<CpuStream>(std::move(name));
#if MP_WITH_CUDA
  return std::make_unique<CudaStream>(device, std::move(name));
#else
  MP_THROW(ConfigError, "stream '", name, "' on ", device, ": mp was built without CUDA");
#endif
}

}  // namespace mp

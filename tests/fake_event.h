// tests/fake_event.h: an event that completes after a given number of
// queries, or never: what a wait on a CUDA event that the device never
// reaches looks like to the host, on a machine without a device.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>

#include "core/host_wait.h"
#include "core/stream.h"

namespace mp::testing {

class FakeEvent final : public EventImpl {
 public:
  // Complete from query number `complete_at` on (1-based); never if 0.
  explicit FakeEvent(int64_t complete_at = 0) : complete_at_(complete_at) {}

  Device device() const override { return Device::cuda(0); }
  bool query() override {
    const int64_t n = queries_.fetch_add(1) + 1;
    return complete_at_ > 0 && n >= complete_at_;
  }
  void synchronize() override { throw std::logic_error("a fake event is only polled, never synchronized"); }
  bool wait_for(std::chrono::nanoseconds timeout) override {
    return poll_until([this] { return query(); }, timeout);
  }
  double seconds_since(const EventImpl&) const override { throw std::logic_error("a fake event has no time"); }

  int64_t queries() const { return queries_.load(); }

 private:
  const int64_t complete_at_;
  std::atomic<int64_t> queries_{0};
};

// An Event over a FakeEvent, and the FakeEvent to inspect.
inline std::pair<Event, std::shared_ptr<FakeEvent>> fake_event(int64_t complete_at = 0) {
  auto impl = std::make_shared<FakeEvent>(complete_at);
  return {Event(impl), impl};
}

}  // namespace mp::testing

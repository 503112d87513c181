#include "runtime/comm_watch.h"

#include <chrono>

#include "core/error.h"

namespace mp {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

}  // namespace

void CommWatch::track(const WorkPtr& w) {
  if (!w) return;
  while (!recent_.empty() && (recent_.size() > 256 || recent_.front()->is_completed())) recent_.pop_front();
  recent_.push_back(w);
  if (!serialize_) return;
  if (compute_ != nullptr) {
    wait_on(*compute_, w->event());
  } else {
    wait(w);
  }
}

void CommWatch::wait(const WorkPtr& w) {
  if (!w) return;
  const auto t0 = Clock::now();
  w->wait();
  exposed_s_ += seconds(t0);
}

void CommWatch::wait_on(Stream& s, const Event& e) {
  // Complete (or failed: its stream's owner reports that): nothing to order.
  if (e.query()) return;
  Event before = s.record_timed();
  s.wait(e);
  stream_waits_.emplace_back(std::move(before), s.record_timed());
}

double CommWatch::exposed_s() const {
  double total = exposed_s_;
  for (const auto& [before, after] : stream_waits_) total += elapsed_seconds(before, after);
  return total;
}

void CommWatch::finish(const Event& e) {
  const double before = exposed_s_;
  wait(e);
  exposed_s_ = before;
}

void CommWatch::wait(const Event& e) {
  const auto t0 = Clock::now();
  const std::chrono::milliseconds timeout = world_.options().timeout;
  if (!e.wait_for(timeout)) {
    for (const WorkPtr& w : recent_) {
      if (!w->is_completed()) w->check_after(timeout);
    }
    abandon_cpu_streams();
    MP_THROW(CommError, "step ", steps_run_, ": the communication thread did not finish within ",
             static_cast<double>(timeout.count()) / 1000.0, " s, with no collective pending");
  }
  exposed_s_ += seconds(t0);
}

}  // namespace mp

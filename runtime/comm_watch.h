// runtime/comm_watch.h: the engine's collectives and its waits on them, in
// one place. Internal to the engine.
//
// Note [Engine waits]
// - track(w): every collective the engine issues passes here, in issue
//   order. While pending it is kept (the newest 256 at most), so that a wait
//   on an event of the communication thread that times out can name the
//   collective that did not complete.
// - wait_on(s, e): orders later work on the compute stream s after a
//   collective's event (no host block); the time s then spends waiting adds
//   to exposed_s(), the step's exposed communication. An event already
//   complete costs nothing.
// - wait(w), wait(e): block the calling (host) thread; the time blocked adds
//   to exposed_s() too. finish(e) blocks like wait(e) without adding (the
//   end of the step's compute).
// - wait(e) on an Event (a unit's reductions, a free gradient buffer) is
//   bounded by the world's timeout like a Work's wait. On expiry the first
//   tracked collective still pending is waited on at once, which throws
//   CommError naming it, its sequence number and the ranks that did not
//   arrive (Note [What completion means] in comm/work.h); with none pending,
//   CommError names the step.
// - With sharding.serialize_communication, track(w) also makes the compute
//   stream wait for w at once (wait_on), so nothing overlaps it and the time
//   the compute stream waits is the collective's whole duration.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace mp {

class CommWatch {
 public:
  // `steps_run` (the engine's step count) is read for error messages.
  CommWatch(Communicator& world, bool serialize, const int64_t& steps_run)
      : world_(world), serialize_(serialize), steps_run_(steps_run) {}

  // The compute stream that serialize_communication orders after every
  // collective (set once the engine has created it).
  void set_compute(Stream* compute) { compute_ = compute; }
  void track(const WorkPtr& w);
  void wait(const WorkPtr& w);
  void wait(const Event& e);
  void finish(const Event& e);
  void wait_on(Stream& s, const Event& e);
  void wait_on(Stream& s, const WorkPtr& w) {
    if (w) wait_on(s, w->event());
  }

  // Host waits plus the stream waits of wait_on, whose events must have
  // completed (call after the step's compute finished).
  double exposed_s() const;
  void reset_exposed() {
    exposed_s_ = 0;
    stream_waits_.clear();
  }

 private:
  Communicator& world_;
  const bool serialize_;
  Stream* compute_ = nullptr;
  const int64_t& steps_run_;
  std::deque<WorkPtr> recent_;
  double exposed_s_ = 0;
  std::vector<std::pair<Event, Event>> stream_waits_;  // timed events before and after each wait_on
};

}  // namespace mp

// core/host_wait.h: how a host thread waits for device work: by polling,
// with a deadline.
//
// Note [Bounded host waits]
// No host thread waits for a CUDA event, stream or device without a
// deadline, and the error at the deadline names what it waited for. CUDA
// has no timed wait (cudaEventSynchronize, cudaStreamSynchronize and
// cudaDeviceSynchronize block until done; by default they spin a core), so:
// - Polling: poll_until() asks a non-blocking query (cudaEventQuery,
//   cudaStreamQuery) and sleeps between asks, 2 us at first, doubling to at
//   most 200 us: a wait ends at most about 0.2 ms late and costs a query
//   per 0.2 ms, well under 1% of a core. A rank that shares its core with
//   its communication threads (Open MPI binds a rank to one core unless
//   told --bind-to none) leaves that core to them while it waits.
// - The deadline comes from whoever owns the work: a CUDA stream's waits
//   (Event::synchronize, Stream::synchronize, its destructor) take
//   StreamOptions::wait_timeout, which the engine and the communicators set
//   to the communicator's timeout (CommConfig.timeout_s, CommOptions::
//   timeout); a wait with no owner to ask (a stream made without options, a
//   device going idle before its buffers are freed) takes
//   kDefaultWaitTimeout, the default of that same timeout.
// - At the deadline the waiter calls abandon_cpu_streams() (core/stream.h:
//   teardown then gives up waiting, since the process is expected to end)
//   and throws: CudaError for a CUDA event or stream (naming the stream,
//   its device and the event), CommError where the wait is part of a
//   collective (naming the collective and its communicator, as Work::wait
//   does).
// - Destructors never throw and never wait without bound either: they wait
//   at most the owner's timeout (nothing once streams were abandoned), then
//   say on stderr what they leave behind and leak it rather than free
//   memory that queued device work may still use.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace mp {

// The wait of a host on device work when no owner gives a timeout: the
// default of CommConfig.timeout_s (comm/communicator.h CommOptions::timeout).
inline constexpr std::chrono::milliseconds kDefaultWaitTimeout{std::chrono::minutes(5)};

// Calls `ready` (which must not block) until it returns true or `timeout`
// has passed, sleeping between calls (2 us doubling to 200 us). Returns
// whether it became ready; `ready` is called at least once, so a zero
// timeout is one query. Exceptions from `ready` propagate.
bool poll_until(const std::function<bool()>& ready, std::chrono::nanoseconds timeout);

// "12.5" for 12.5 s: durations in the messages of timed-out waits.
std::string seconds_text(std::chrono::nanoseconds d);

// For a destructor that gives up on a wait: one line on stderr, "[rank R]
// mp: <what> did not finish within <timeout> s; <consequence>".
void report_abandoned_wait(const std::string& what, std::chrono::nanoseconds timeout,
                           const std::string& consequence) noexcept;

}  // namespace mp

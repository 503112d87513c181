#include "comm/work.h"

#include "core/error.h"

namespace mp {

std::string CollectiveInfo::describe() const {
  // The control plane's exchanges (Note [Control plane]) count bytes.
  if (op.starts_with("host_")) return detail::str(op, " #", sequence, " (", count, " bytes)");
  return detail::str(op, " #", sequence, " (", dtype_name(dtype), " x ", count, ")");
}

Work::Work(CollectiveInfo info, Event done, std::string communicator_name,
           std::chrono::milliseconds default_timeout, Diagnose diagnose)
    : info_(std::move(info)),
      done_(std::move(done)),
      communicator_name_(std::move(communicator_name)),
      default_timeout_(default_timeout),
      diagnose_(std::move(diagnose)) {}

void Work::wait(std::chrono::milliseconds timeout) const {
  if (done_.wait_for(timeout)) return;  // rethrows the collective's failure
  throw_timeout(timeout);
}

void Work::check_after(std::chrono::milliseconds waited) const {
  if (done_.wait_for(std::chrono::nanoseconds(0))) return;
  throw_timeout(waited);
}

void Work::throw_timeout(std::chrono::milliseconds timeout) const {
  // The communication thread may never come back: teardown must not wait
  // for it (core/stream.h).
  abandon_cpu_streams();
  const std::string diagnosis = diagnose_ ? diagnose_(info_) : std::string();
  MP_THROW(CommError, info_.describe(), " on communicator '", communicator_name_,
           "' did not complete within ", static_cast<double>(timeout.count()) / 1000.0, " s. ",
           diagnosis);
}

}  // namespace mp

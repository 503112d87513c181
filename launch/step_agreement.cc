#include "launch/step_agreement.h"

#include <algorithm>
#include <cstdio>

#include "core/stop_signals.h"

namespace mp {

StepAgreement agree_on_step(Communicator& comm, bool checkpoint_time, const StepTimings& timings,
                            bool save_written) {
  constexpr size_t k = 4;
  const double mine[k] = {static_cast<double>(stop_signal()), checkpoint_time ? 1.0 : 0.0,
                          timings.total_s - timings.exposed_comm_s, save_written ? 1.0 : 0.0};
  const std::vector<double> all = comm.all_gather_double(mine);
  StepAgreement a;
  std::vector<double> busy(all.size() / k);
  for (size_t j = 0; j < busy.size(); ++j) {
    a.signal = std::max(a.signal, static_cast<int>(all[k * j]));
    busy[j] = all[k * j + 2];
    a.save_written = a.save_written && all[k * j + 3] != 0;
  }
  a.checkpoint_time = all[1] != 0;
  a.straggler = find_straggler(busy);
  return a;
}

std::optional<std::string> find_straggler(const std::vector<double>& busy) {
  if (busy.size() < 2) return std::nullopt;
  const auto slowest = std::max_element(busy.begin(), busy.end());
  std::vector<double> others = busy;  // the median of the other ranks
  others.erase(others.begin() + (slowest - busy.begin()));
  std::sort(others.begin(), others.end());
  const double median = others[(others.size() - 1) / 2];
  if (*slowest < 3 * median || *slowest - median < 1.0) return std::nullopt;
  char text[160];
  std::snprintf(text, sizeof(text), "rank %d is a straggler: %.2f s of work in this step against a median of %.2f s on the others",
                static_cast<int>(slowest - busy.begin()), *slowest, median);
  return std::string(text) + " (the others waited for it)";
}

}  // namespace mp

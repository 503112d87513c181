#include "runtime/fault.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string_view>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/strings.h"

namespace mp {
namespace {

int64_t to_int(const std::string& text, const std::string& entry, const char* what) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < 0) {
    MP_THROW(ConfigError, "MP_FAULT entry '", entry, "': ", what, " '", text, "' is not a non-negative integer");
  }
  return v;
}

struct Plan {
  bool on = false;
  std::vector<Fault> faults;
};

const Plan& plan() {
  static const Plan p = [] {
    Plan q;
    const char* env = std::getenv("MP_FAULT");
    if (env != nullptr && *env != '\0') {
      q.faults = parse_faults(env);
      q.on = !q.faults.empty();
    }
    return q;
  }();
  return p;
}

}  // namespace

std::vector<Fault> parse_faults(const std::string& text) {
  std::vector<Fault> out;
  for (const std::string& entry : split(text, ';')) {
    if (entry.empty()) continue;
    const size_t at = entry.find('@');
    if (at == std::string::npos) MP_THROW(ConfigError, "MP_FAULT entry '", entry, "': expected KIND@STEP:RANK[:ARG]");
    const std::string kind = entry.substr(0, at);
    const std::vector<std::string> f = split(entry.substr(at + 1), ':');
    static constexpr std::pair<std::string_view, FaultKind> kKinds[] = {
        {"kill", FaultKind::kKill},           {"hang", FaultKind::kHang},
        {"sleep", FaultKind::kSleep},         {"nan", FaultKind::kNan},
        {"write_fail", FaultKind::kWriteFail}, {"device_fault", FaultKind::kDeviceFault},
        {"save_kill", FaultKind::kSaveKill},  {"segv", FaultKind::kSegv}};
    const auto* known =
        std::find_if(std::begin(kKinds), std::end(kKinds), [&](const auto& k) { return k.first == kind; });
    if (known == std::end(kKinds)) {
      MP_THROW(ConfigError, "MP_FAULT entry '", entry, "': unknown kind '", kind,
               "' (kill, hang, sleep, nan, write_fail, device_fault, save_kill, segv)");
    }
    Fault fault;
    fault.kind = known->second;
    const bool needs_arg = fault.kind == FaultKind::kSleep;
    const bool takes_arg = needs_arg || fault.kind == FaultKind::kNan;
    if (f.size() < 2 || f.size() > (takes_arg ? 3u : 2u) || (needs_arg && f.size() != 3)) {
      MP_THROW(ConfigError, "MP_FAULT entry '", entry, "': expected ", kind, "@STEP:RANK",
               needs_arg ? ":SECONDS" : takes_arg ? "[:UNIT]" : "");
    }
    const size_t dash = f[0].find('-');
    fault.first_step = to_int(f[0].substr(0, dash), entry, "step");
    fault.last_step = dash == std::string::npos ? fault.first_step : to_int(f[0].substr(dash + 1), entry, "step");
    if (fault.last_step < fault.first_step) MP_THROW(ConfigError, "MP_FAULT entry '", entry, "': empty step range");
    fault.rank = static_cast<int>(to_int(f[1], entry, "rank"));
    if (fault.kind == FaultKind::kSleep) {
      char* end = nullptr;
      fault.seconds = std::strtod(f[2].c_str(), &end);
      if (end == f[2].c_str() || *end != '\0' || !(fault.seconds >= 0)) {
        MP_THROW(ConfigError, "MP_FAULT entry '", entry, "': seconds '", f[2], "' is not a non-negative number");
      }
    }
    if (fault.kind == FaultKind::kNan && f.size() == 3) fault.unit = static_cast<int>(to_int(f[2], entry, "unit"));
    out.push_back(fault);
  }
  return out;
}

const Fault* find_fault(FaultKind kind, int64_t step, int rank) {
  const Plan& p = plan();
  if (!p.on) return nullptr;
  for (const Fault& f : p.faults) {
    if (f.kind == kind && f.rank == rank && step >= f.first_step && step <= f.last_step) return &f;
  }
  return nullptr;
}

// A store through a null pointer the compiler cannot see is null: a real
// SIGSEGV in a frame of its own (the crash report names it).
namespace {
[[gnu::noinline]] void store_through_null() {
  volatile int* volatile p = nullptr;
  *p = 1;
}
}  // namespace

void inject_step_faults(int64_t step, int rank) {
  if (!plan().on) return;  // MP_FAULT unset
  if (find_fault(FaultKind::kSegv, step, rank) != nullptr) {
    std::fprintf(stderr, "[rank %d] MP_FAULT: SIGSEGV at step %lld\n", rank, static_cast<long long>(step));
    std::fflush(stderr);
    store_through_null();
  }
  if (find_fault(FaultKind::kKill, step, rank) != nullptr) {
    std::fprintf(stderr, "[rank %d] MP_FAULT: SIGKILL at step %lld\n", rank, static_cast<long long>(step));
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
  }
  if (find_fault(FaultKind::kHang, step, rank) != nullptr) {
    std::fprintf(stderr, "[rank %d] MP_FAULT: hanging at step %lld\n", rank, static_cast<long long>(step));
    std::fflush(stderr);
    while (true) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  if (const Fault* f = find_fault(FaultKind::kSleep, step, rank)) {
    std::fprintf(stderr, "[rank %d] MP_FAULT: sleeping %g s at step %lld\n", rank, f->seconds,
                 static_cast<long long>(step));
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::duration<double>(f->seconds));
  }
}

void inject_save_kill(int64_t step, int rank) {
  if (find_fault(FaultKind::kSaveKill, step, rank) == nullptr) return;
  std::fprintf(stderr, "[rank %d] MP_FAULT: SIGKILL while writing the checkpoint of step %lld\n", rank,
               static_cast<long long>(step));
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
}

}  // namespace mp

#include "core/stop_signals.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "core/parallel.h"

namespace mp {
namespace {

// Both are touched by a signal handler: lock-free atomics only.
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);
std::atomic<int> g_signal{0};
std::atomic<bool> g_recording{false};

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  return set;
}

extern "C" void record_stop_signal(int sig) { g_signal.store(sig); }

// The watcher: takes every SIGTERM and SIGUSR1 sent to the process (our
// threads block them, so the kernel leaves them pending for sigwait).
void watch() {
  const sigset_t set = stop_set();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (g_recording.load()) {
      g_signal.store(sig);
      continue;
    }
    // Not recording: the signal's usual effect, here, with the disposition
    // StopSignalScope restored (the default one ends the process).
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    raise(sig);  // pending on this thread until the unblock below
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    pthread_sigmask(SIG_BLOCK, &one, nullptr);
  }
}

std::once_flag g_watcher_started;

}  // namespace

void block_stop_signals_in_this_thread() {
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void install_stop_signal_watcher() {
  block_stop_signals_in_this_thread();
  // The watcher inherits the block: sigwait needs the signals blocked.
  std::call_once(g_watcher_started, [] {
    std::thread([] {
      name_this_thread("signals");
      watch();
    }).detach();
  });
}

int stop_signal() { return g_signal.load(); }

const char* stop_signal_name(int sig) {
  return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

namespace {
struct sigaction g_saved_term {}, g_saved_usr1 {};
}  // namespace

StopSignalScope::StopSignalScope() {
  install_stop_signal_watcher();
  g_signal.store(0);
  // For threads that began before the watcher and do not block the signals.
  struct sigaction sa {};
  sa.sa_handler = record_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, &g_saved_term);
  sigaction(SIGUSR1, &sa, &g_saved_usr1);
  g_recording.store(true);
}

StopSignalScope::~StopSignalScope() {
  g_recording.store(false);
  sigaction(SIGTERM, &g_saved_term, nullptr);
  sigaction(SIGUSR1, &g_saved_usr1, nullptr);
}

}  // namespace mp

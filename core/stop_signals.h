// core/stop_signals.h: SIGTERM and SIGUSR1, the signals a scheduler sends
// before it ends a job (Slurm's --signal, Kubernetes, `kill`), taken by one
// watcher thread and never by a thread that computes.
//
// Note [Signals and oneDNN]
// oneDNN's generated f32 GEMM kernels (x64 gemm:jit, before oneDNN 3.11.1:
// uxlfoundation/oneDNN#4845) point rsp into a heap buffer while they run. A
// signal handled on such a thread has its frame pushed below that rsp, into
// the heap, and glibc aborts later ("corrupted size vs. prev_size while
// consolidating") or the process crashes. Debian 12 ships oneDNN 2.7. It
// failed CI once: worker_checkpoint_signal_np2, rank 0 segfaulted after
// SIGTERM; here it aborted in 2 of 40 runs, in a GEMM of the step SIGTERM
// arrived in. A loop of gemm_cpu calls, with a handler installed and SIGUSR1
// sent every 20 us, crashed 5 times in 5 within 40 ms (the signal-storm test
// in tests/test_stop_signals.cc is that loop).
// So no thread that may run oneDNN takes these signals:
//   * install_stop_signal_watcher(), first in main(), blocks them before any
//     other thread exists, so every thread inherits the block, and starts the
//     one thread that takes them (sigwait);
//   * the pool's workers (core/parallel.h) and the CPU streams' workers
//     block them as they start, for programs whose threads began before the
//     watcher.
// While a StopSignalScope is alive, a signal is recorded (stop_signal()) and
// the program acts on it at a point of its choosing (mp_worker: a checkpoint
// at the next step boundary). Otherwise the watcher raises it again with the
// disposition the process had when the watcher was installed (normally:
// the process ends), so SIGTERM outside training still ends a rank at once.
#pragma once

namespace mp {

// Blocks SIGTERM and SIGUSR1 in the calling thread and starts the watcher
// thread (once; later calls only block). Call first in main(), before MPI or
// any thread starts.
void install_stop_signal_watcher();

// Blocks SIGTERM and SIGUSR1 in the calling thread (a worker that computes).
void block_stop_signals_in_this_thread();

// The signal recorded while a StopSignalScope was alive, 0 if none.
int stop_signal();

// "SIGTERM", "SIGUSR1", else "a signal".
const char* stop_signal_name(int sig);

// Records SIGTERM and SIGUSR1 for its lifetime instead of their usual effect.
// Installs the watcher if nobody has (threads started earlier that do not
// block the signals get a handler that records them too: such a thread is
// not one of ours, and does not run oneDNN). Not nested.
class StopSignalScope {
 public:
  StopSignalScope();
  ~StopSignalScope();
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;
};

}  // namespace mp

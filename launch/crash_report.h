// launch/crash_report.h: what a rank that crashes leaves behind.
//
// Note [Crash reports]
// install_crash_report() makes SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT
// write a report before the process dies as it would have: the handler runs
// once, then the signal's default action (exit status and core dump as
// without it) follows. The report has
//   - the signal, its code and address, the label ("mp_worker rank 1") and
//     the thread that took it, with the program counter of the fault;
//   - every thread's stack: the crashing thread's from its handler, each
//     other's from a handler of SIGRTMIN+5 sent to it with tgkill (they
//     have 1 s in all to answer; one that blocks the signal is named as
//     silent), thread names from /proc/self/task;
//   - each frame symbolized (function, file:line, inlined frames) by
//     addr2line run in a child process per module, from the module offsets
//     in /proc/self/maps; without addr2line, MODULE+OFFSET.
// The report goes to stderr and, given a path, to that file too (mp_worker:
// OUT_DIR/crash.rank<R>.txt). In the handler everything is
// async-signal-safe: open, read, write, getdents64, tgkill, nanosleep,
// _Fork, execve, waitpid and atomics; no allocation and no locks. The one
// exception is backtrace(), whose first call loads the unwinder, so
// install_crash_report() calls it once beforehand.
// Limits: a thread that overflowed its stack is reported only when it is
// the installing thread (the one with the alternate signal stack); up to
// kMaxThreads threads and kMaxFrames frames each. Sanitizer builds leave
// these signals to the sanitizer, whose report is better.
#pragma once

#include <string>

namespace mp {

// Installs the handlers (again: replaces the path and label). `path` empty:
// stderr only. Throws IoError when the handlers cannot be installed.
void install_crash_report(const std::string& path, const std::string& label);

// mp_worker's: OUT_DIR/crash.rank<R>.txt (stderr alone without an out_dir),
// labelled "mp_worker rank R". mp_worker installs it before MPI starts
// (the rank its launcher gives) and again once MPI has (MPI's rank, and
// over the handlers Open MPI may have installed).
void install_worker_crash_report(const std::string& out_dir, int rank);

}  // namespace mp

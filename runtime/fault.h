// runtime/fault.h: faults injected on purpose, so the reliability tests can
// show what the runtime does when a rank dies, hangs, lags, produces NaN or
// cannot write a checkpoint (docs/reliability.md "Faults").
//
// Note [Fault injection]
// MP_FAULT lists faults, separated by ';', each KIND@STEP:RANK[:ARG]:
//   kill@5:1          rank 1 sends itself SIGKILL at the start of step 5
//   hang@5:1          rank 1 stops at the start of step 5 and never goes on
//                     (the others then wait in their first collective)
//   sleep@5:1:2.5     rank 1 sleeps 2.5 s at the start of step 5 (a straggler)
//   nan@5:1:3         rank 1's gradients of unit 3 (default 0) are NaN in
//                     step 5 (every micro-batch); nan@5-9:1 for steps 5..9
//   write_fail@5:1    rank 1's checkpoint write fails in step 5's save, as
//                     on a full disk
//   save_kill@5:1     rank 1 sends itself SIGKILL in the middle of writing
//                     step 5's checkpoint file (after its first chunk; with
//                     checkpoint.async_save, after the first 8 MiB or the
//                     aligned part of a smaller file, before its tail and
//                     fsync, in the background writer while training goes on)
//   segv@5:1          rank 1 stores through a null pointer at the start of
//                     step 5 (a real SIGSEGV: launch/crash_report.h)
//   device_fault@5:1  rank 1's compute stream runs a kernel that writes
//                     outside its memory at the start of step 5 (an illegal
//                     memory access; CUDA engines only, ConfigError on the CPU)
// STEP may be a range A-B. Test use only: with MP_FAULT unset each hook is
// one load of a flag that is false. A malformed MP_FAULT is a ConfigError
// naming the entry.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mp {

enum class FaultKind { kKill, kHang, kSleep, kNan, kWriteFail, kDeviceFault, kSaveKill, kSegv };

struct Fault {
  FaultKind kind = FaultKind::kKill;
  int64_t first_step = 0, last_step = 0;
  int rank = 0;
  double seconds = 0;  // kSleep
  int unit = 0;        // kNan
};

// Parses a fault list (the syntax above). Throws ConfigError naming the entry.
std::vector<Fault> parse_faults(const std::string& text);

// The fault of `kind` for (step, rank) in MP_FAULT, or null.
const Fault* find_fault(FaultKind kind, int64_t step, int rank);

// The start-of-step faults (kill, hang, sleep) for this rank and step.
// Prints what it does to stderr first.
void inject_step_faults(int64_t step, int rank);

// save_kill: SIGKILL when MP_FAULT asks for it while writing the checkpoint
// of `step` on `rank` (printed to stderr first). Safe from any thread.
void inject_save_kill(int64_t step, int rank);

}  // namespace mp

// core/parallel.h: CPU threads for element loops (the fused optimizer
// step, conversions). A process-wide pool of persistent workers, so a call
// costs a wake-up, not a thread start.
//
// Thread count: what the launcher set (set_default_cpu_threads), else
// MP_NUM_THREADS if set (a positive integer), else the CPUs this process may
// run on (sched_getaffinity: mpirun's --bind-to core gives each rank one). Calls from several threads take turns; a call from inside
// a parallel_for body runs inline on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace mp {

// The default number of threads; throws ConfigError for a bad MP_NUM_THREADS.
int default_cpu_threads();

// What default_cpu_threads() returns from now on (0: MP_NUM_THREADS or the
// CPUs again). A launcher that gives each rank its share of a node's cores
// (mp_worker: the model's threads) sets it, so that the engine's loops and
// GEMMs (the update, Muon's Newton-Schulz) use that share too, not every
// core of the node on each rank. Results do not depend on it.
void set_default_cpu_threads(int threads);

// Names the calling thread "mp:" + `name` (15 bytes at most, as Linux
// keeps them), for debuggers, top -H and crash reports.
void name_this_thread(const std::string& name);

// Splits [0, n) into `threads` contiguous parts whose boundaries are
// multiples of `align` (except n) and runs body(begin, end) on each, the
// calling thread taking the first. Empty parts are skipped. threads <= 0
// means default_cpu_threads(). The first exception thrown by any part is
// rethrown here after all parts have finished.
void parallel_for(int64_t n, int threads, int64_t align, const std::function<void(int64_t, int64_t)>& body);

}  // namespace mp

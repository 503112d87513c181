// bench/timing.h: interleaved timing of several contenders (ours and the
// reference) across all ranks of a communicator.
//
// Method:
// - Every contender runs `warmup` untimed iterations first (page faults,
//   lazy connection set-up, scratch allocation).
// - Then `iters` rounds. Each round runs every contender once, in an order
//   that rotates from round to round (ours-ref, ref-ours, ...), so slow
//   phases of a noisy machine hit every contender alike.
// - Each timed call is preceded by a barrier on `comm`, so all ranks start
//   together; a rank's time is from leaving the barrier to the call's return
//   (for a collective: its completion on that rank).
// - An iteration's time is the maximum over ranks (the collective is done
//   when the last rank is), and a contender's result is the median over
//   iterations, with the minimum beside it.
// - Page faults: the process's minor page faults during each timed call
//   (all threads, so the communication thread's count), the maximum over
//   ranks, median over iterations. Memory touched for the first time costs
//   about 9 us per 4 KiB page on these machines (docs/benchmarks.md), so a call that
//   faults in fresh pages every time shows here.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace mp::bench {

struct Contender {
  std::string name;
  std::function<void()> run;  // one complete operation (issue and wait)
};

struct Timing {
  double median_s = 0;
  double min_s = 0;
  double median_page_faults = 0;  // minor faults per call, slowest-faulting rank
};

// Collective over `comm`. Results are valid on rank 0 of `comm`; other ranks
// get zeros.
std::vector<Timing> time_interleaved(MPI_Comm comm, const std::vector<Contender>& contenders,
                                     int warmup, int iters);

// The median of `samples` (the mean of the middle two for an even count);
// 0 for none.
double median(std::vector<double> samples);

// One contender on this rank's clock: `warmup` untimed calls, then `iters`
// timed ones (iters >= 1). With `sync` other than MPI_COMM_NULL every call,
// warm-up included, starts after a barrier on it (collective over `sync`),
// so all ranks run together.
struct LocalTiming {
  double median_s = 0;
  double min_s = 0;
};
LocalTiming time_local(int warmup, int iters, const std::function<void()>& run, MPI_Comm sync = MPI_COMM_NULL);

// This rank's STREAM triad (a = b + 3 c over n floats, 12 bytes per element
// as STREAM counts them) on `threads` threads, in GB/s of the median run;
// every run starts after a barrier on `sync` (all ranks at once) unless it
// is MPI_COMM_NULL.
double stream_triad_gbps(int64_t n, int threads, int warmup, int iters, MPI_Comm sync = MPI_COMM_NULL);

}  // namespace mp::bench

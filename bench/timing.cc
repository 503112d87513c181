#include "bench/timing.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>

#include "runtime/error.h"
#include "runtime/error_mpi.h"

namespace mp::bench {
namespace {

double median_of(std::vector<double> v) {
  MP_ENFORCE(!v.empty(), "median of no samples");
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

double minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_minflt);
}

}  // namespace

std::vector<Timing> time_interleaved(MPI_Comm comm, const std::vector<Contender>& contenders,
                                     int warmup, int iters) {
  MP_ENFORCE(iters >= 1, "time_interleaved needs at least one timed iteration, got ", iters);
  MP_ENFORCE(warmup >= 0, "negative warm-up count ", warmup);
  const size_t k = contenders.size();
  MP_ENFORCE(k >= 1, "time_interleaved needs a contender");
  for (int w = 0; w < warmup; ++w) {
    for (const Contender& c : contenders) {
      MP_CHECK_MPI(MPI_Barrier(comm));
      c.run();
    }
  }
  // samples[c * iters + i]: contender c, iteration i, on this rank: seconds
  // in the first n entries, page faults in the next n.
  const size_t n = k * static_cast<size_t>(iters);
  std::vector<double> samples(2 * n, 0.0);
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < iters; ++i) {
    for (size_t j = 0; j < k; ++j) {
      const size_t c = (static_cast<size_t>(i) + j) % k;
      const size_t at = c * static_cast<size_t>(iters) + static_cast<size_t>(i);
      MP_CHECK_MPI(MPI_Barrier(comm));
      const double faults = minor_faults();
      const auto start = Clock::now();
      contenders[c].run();
      samples[at] = std::chrono::duration<double>(Clock::now() - start).count();
      samples[n + at] = minor_faults() - faults;
    }
  }
  int rank = 0;
  MP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  std::vector<double> slowest(2 * n, 0.0);
  MP_CHECK_MPI(MPI_Reduce(samples.data(), slowest.data(), static_cast<int>(2 * n), MPI_DOUBLE, MPI_MAX,
                          0, comm));
  std::vector<Timing> out(k);
  if (rank != 0) return out;
  for (size_t c = 0; c < k; ++c) {
    const auto first = slowest.begin() + static_cast<std::ptrdiff_t>(c * static_cast<size_t>(iters));
    const std::vector<double> times(first, first + iters);
    out[c].median_s = median_of(times);
    out[c].min_s = *std::min_element(times.begin(), times.end());
    const auto faults = first + static_cast<std::ptrdiff_t>(n);
    out[c].median_page_faults = median_of(std::vector<double>(faults, faults + iters));
  }
  return out;
}

}  // namespace mp::bench

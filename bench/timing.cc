#include "bench/timing.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>

#include "comm/mpi/mpi_error.h"
#include "core/error.h"
#include "core/parallel.h"

namespace mp::bench {
namespace {

double minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_minflt);
}

}  // namespace

double median(std::vector<double> samples) {
  if (samples.empty()) return 0.0;
  std::sort(samples.begin(), samples.end());
  const size_t mid = samples.size() / 2;
  return samples.size() % 2 ? samples[mid] : 0.5 * (samples[mid - 1] + samples[mid]);
}

LocalTiming time_local(int warmup, int iters, const std::function<void()>& run, MPI_Comm sync) {
  MP_ENFORCE(warmup >= 0 && iters >= 1, "time_local: warmup ", warmup, ", iters ", iters);
  const auto barrier = [&] {
    if (sync != MPI_COMM_NULL) MP_CHECK_MPI(MPI_Barrier(sync));
  };
  for (int i = 0; i < warmup; ++i) {
    barrier();
    run();
  }
  std::vector<double> s;
  for (int i = 0; i < iters; ++i) {
    barrier();
    const auto t0 = std::chrono::steady_clock::now();
    run();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return LocalTiming{median(s), *std::min_element(s.begin(), s.end())};
}

namespace {
void triad(float* __restrict a, const float* __restrict b, const float* __restrict c, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + 3.0f * c[i];
}
}  // namespace

double stream_triad_gbps(int64_t n, int threads, int warmup, int iters, MPI_Comm sync) {
  std::vector<float> a(static_cast<size_t>(n), 0.0f), b(static_cast<size_t>(n), 1.0f), c(static_cast<size_t>(n), 2.0f);
  const double s = time_local(warmup, iters, [&] {
    parallel_for(n, threads, 64, [&](int64_t lo, int64_t hi) { triad(a.data(), b.data(), c.data(), lo, hi); });
  }, sync).median_s;
  return 12.0 * static_cast<double>(n) / s / 1e9;
}

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
    out[c].median_s = median(times);
    out[c].min_s = *std::min_element(times.begin(), times.end());
    const auto faults = first + static_cast<std::ptrdiff_t>(n);
    out[c].median_page_faults = median(std::vector<double>(faults, faults + iters));
  }
  return out;
}

}  // namespace mp::bench

#include "core/parallel.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/stop_signals.h"

namespace mp {
namespace {

thread_local bool t_inside_parallel_for = false;

// Workers wait for a new generation, run their part, and count down.
class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void run(int parts, const std::function<void(int)>& part) {
    std::lock_guard<std::mutex> call(call_mu_);  // one call at a time
    std::unique_lock<std::mutex> lock(mu_);
    while (static_cast<int>(workers_.size()) < parts - 1) {
      const int id = static_cast<int>(workers_.size()) + 1;
      workers_.emplace_back([this, id] {
        name_this_thread("pool");
        worker(id);
      });
    }
    part_ = &part;
    parts_ = parts;
    pending_ = parts - 1;
    error_ = nullptr;
    ++generation_;
    lock.unlock();
    wake_.notify_all();
    run_part(0);
    lock.lock();
    done_.wait(lock, [&] { return pending_ == 0; });
    part_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run_part(int id) {
    t_inside_parallel_for = true;
    try {
      (*part_)(id);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    t_inside_parallel_for = false;
  }

  void worker(int id) {
    block_stop_signals_in_this_thread();  // Note [Signals and oneDNN]
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (id >= parts_) continue;
      lock.unlock();
      run_part(id);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex call_mu_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* part_ = nullptr;
  int parts_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool p;
  return p;
}

std::atomic<int> g_default_threads{0};  // set_default_cpu_threads

}  // namespace

void name_this_thread(const std::string& name) {
  pthread_setname_np(pthread_self(), ("mp:" + name).substr(0, 15).c_str());
}

void set_default_cpu_threads(int threads) {
  MP_ENFORCE(threads >= 0, "set_default_cpu_threads(", threads, ")");
  g_default_threads.store(threads, std::memory_order_relaxed);
}

int default_cpu_threads() {
  if (const int set = g_default_threads.load(std::memory_order_relaxed); set > 0) return set;
  if (const char* env = std::getenv("MP_NUM_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 1 || v > 4096) {
      MP_THROW(ConfigError, "MP_NUM_THREADS='", env, "' is not a thread count (a positive integer)");
    }
    return static_cast<int>(v);
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

void parallel_for(int64_t n, int threads, int64_t align, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  if (threads <= 0) threads = default_cpu_threads();
  align = std::max<int64_t>(align, 1);
  const int64_t blocks = (n + align - 1) / align;
  const int parts = static_cast<int>(std::min<int64_t>(threads, blocks));
  if (parts <= 1 || t_inside_parallel_for) {
    body(0, n);
    return;
  }
  auto bound = [&](int k) { return std::min(n, blocks * k / parts * align); };
  pool().run(parts, [&](int k) {
    const int64_t b = bound(k), e = bound(k + 1);
    if (b < e) body(b, e);
  });
}

}  // namespace mp

#include "core/device.h"

#include <cstdlib>
#include <ostream>
#include <string>
#include <thread>

#include "core/cuda_device.h"
#include "core/error.h"
#include "mp/config.h"

namespace mp {

std::string to_string(Device d) {
  return d.is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

std::ostream& operator<<(std::ostream& os, Device d) { return os << to_string(d); }

CudaInfo cuda_info() {
#if MP_WITH_CUDA
  return detail::cuda_probe();
#else
  return CudaInfo{0, "built without CUDA (MP_CUDA=OFF or nvcc not found)"};
#endif
}

void set_current_device(Device d) {
  if (d.is_cpu()) return;
#if MP_WITH_CUDA
  detail::cuda_set_device(d.index);
#else
  MP_THROW(ConfigError, "device ", d, " requested but mp was built without CUDA");
#endif
}

void wait_for_device_idle(Device d, std::chrono::milliseconds timeout) noexcept {
  if (d.is_cpu()) return;
#if MP_WITH_CUDA
  detail::cuda_wait_idle(d.index, timeout);
#else
  (void)timeout;
#endif
}

bool cuda_sync_each_op() {
  static const bool on = [] {
    const char* env = std::getenv("MP_CUDA_SYNC");
    if (env == nullptr || *env == '\0' || std::string(env) == "0") return false;
    if (std::string(env) == "1") return true;
    MP_THROW(ConfigError, "MP_CUDA_SYNC = '", env, "': use 1 (synchronise after every CUDA op) or 0");
  }();
  return on;
}

std::string describe_device(Device d) {
  if (d.is_cpu()) {
    return detail::str("cpu (", std::thread::hardware_concurrency(), " hardware threads)");
  }
#if MP_WITH_CUDA
  return detail::cuda_describe(d.index);
#else
  MP_THROW(ConfigError, "device ", d, " requested but mp was built without CUDA");
#endif
}

}  // namespace mp

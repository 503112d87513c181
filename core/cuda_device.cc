#include "core/cuda_device.h"

#include <cuda_runtime_api.h>

#include <future>
#include <memory>
#include <thread>

#include "core/error_cuda.h"
#include "core/host_wait.h"
#include "core/stream.h"

namespace mp::detail {

CudaInfo cuda_probe() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Clear the sticky "last error" so later unrelated checks do not see it.
    (void)cudaGetLastError();
    const char* what = err == cudaErrorInsufficientDriver ? "no usable CUDA driver"
                       : err == cudaErrorNoDevice         ? "no CUDA device"
                                                          : "CUDA cannot start";
    return CudaInfo{0, str(what, " (", cudaGetErrorName(err), ": ", cudaGetErrorString(err), ")")};
  }
  if (count == 0) return CudaInfo{0, "no CUDA device visible"};
  return CudaInfo{count, ""};
}

void cuda_set_device(int index) { MP_CHECK_CUDA(cudaSetDevice(index)); }

void cuda_wait_idle(int index, std::chrono::milliseconds timeout) noexcept {
  // cudaDeviceSynchronize has no timeout and the device has no query: it
  // runs on a thread of its own, which is left behind (detached) if the
  // device is not idle in time (Note [Bounded host waits]).
  if (cpu_streams_abandoned()) return;  // the process is about to end: no final waits
  try {
    auto idle = std::make_shared<std::promise<void>>();
    std::future<void> done = idle->get_future();
    std::thread([index, idle] {
      if (cudaSetDevice(index) == cudaSuccess) (void)cudaDeviceSynchronize();
      idle->set_value();
    }).detach();
    if (done.wait_for(timeout) == std::future_status::ready) return;
    abandon_cpu_streams();
    report_abandoned_wait(str("cuda:", index, " (every stream of the device)"), timeout,
                          "its buffers may be freed while work still uses them");
  } catch (...) {
    // No thread could be started: nothing was waited for.
  }
}

std::string cuda_describe(int index) {
  cudaDeviceProp prop{};
  MP_CHECK_CUDA(cudaGetDeviceProperties(&prop, index));
  return str("cuda:", index, " ", prop.name, " (sm_", prop.major, prop.minor, ", ",
             static_cast<double>(prop.totalGlobalMem) / (1ull << 30), " GiB)");
}

void* cuda_malloc(int index, size_t size_bytes) {
  int previous = 0;
  MP_CHECK_CUDA(cudaGetDevice(&previous));
  MP_CHECK_CUDA(cudaSetDevice(index));
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, size_bytes);
  MP_CHECK_CUDA(cudaSetDevice(previous));
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  MP_CHECK_CUDA(err);
  return ptr;
}

void cuda_free(int index, void* ptr) noexcept {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  // Errors here (a dead context at exit) cannot be reported from a destructor.
  if (cudaSetDevice(index) == cudaSuccess) (void)cudaFree(ptr);
  (void)cudaSetDevice(previous);
}

void cuda_memcpy(void* dst, const void* src, size_t size_bytes, void* stream) {
  if (size_bytes == 0) return;
  if (stream) {
    MP_CHECK_CUDA(cudaMemcpyAsync(dst, src, size_bytes, cudaMemcpyDefault,
                                  static_cast<cudaStream_t>(stream)));
  } else {
    MP_CHECK_CUDA(cudaMemcpy(dst, src, size_bytes, cudaMemcpyDefault));
  }
}

void cuda_memset_zero(void* dst, size_t size_bytes, void* stream) {
  if (size_bytes == 0) return;
  if (stream) {
    MP_CHECK_CUDA(cudaMemsetAsync(dst, 0, size_bytes, static_cast<cudaStream_t>(stream)));
  } else {
    MP_CHECK_CUDA(cudaMemset(dst, 0, size_bytes));
  }
}

}  // namespace mp::detail

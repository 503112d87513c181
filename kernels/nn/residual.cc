#include "kernels/nn/residual.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#if MP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/error_cuda.h"
#endif

namespace mp::nn {
namespace {
constexpr int64_t kChunkBytes = int64_t{1} << 18;  // per thread part of a CPU copy or fill
}  // namespace

void copy(const OpContext& cx, void* dst, const void* src, int64_t bytes, const char* name) {
  MP_ENFORCE(bytes >= 0, "copy of ", bytes, " bytes");
  const int threads = cx.threads;
  cx.run(
      name, OpFamily::kElementwise,
      [=] {
        parallel_for(bytes, threads, kChunkBytes, [&](int64_t i0, int64_t i1) {
          std::memcpy(static_cast<char*>(dst) + i0, static_cast<const char*>(src) + i0, static_cast<size_t>(i1 - i0));
        });
      },
      MP_CUDA_BODY(MP_CHECK_CUDA(
          cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, cuda_stream))));
}

void copy_to_host(const OpContext& cx, void* host, const void* src, int64_t bytes, const char* name) {
  MP_ENFORCE(bytes >= 0, "copy of ", bytes, " bytes");
  cx.run(
      name, OpFamily::kElementwise, [=] { std::memcpy(host, src, static_cast<size_t>(bytes)); },
      MP_CUDA_BODY(MP_CHECK_CUDA(
          cudaMemcpyAsync(host, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, cuda_stream))));
}

void zero(const OpContext& cx, void* dst, int64_t bytes, const char* name) {
  MP_ENFORCE(bytes >= 0, "fill of ", bytes, " bytes");
  const int threads = cx.threads;
  cx.run(
      name, OpFamily::kElementwise,
      [=] {
        parallel_for(bytes, threads, kChunkBytes, [&](int64_t i0, int64_t i1) {
          std::memset(static_cast<char*>(dst) + i0, 0, static_cast<size_t>(i1 - i0));
        });
      },
      MP_CUDA_BODY(MP_CHECK_CUDA(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), cuda_stream))));
}

}  // namespace mp::nn

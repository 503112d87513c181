// core/error_cuda.h: one check macro per CUDA library (CUDA runtime,
// cuBLASLt, cuDNN; NCCL's is comm/nccl/nccl_error.h). Each throws
// CudaError naming the call, the library's error name and text, file:line and
// rank. Only for builds with MP_WITH_CUDA; cuBLASLt and cuDNN statuses are
// named here without linking either (both are loaded at run time).
#pragma once

#include "core/error.h"
#include "mp/config.h"

#if !MP_WITH_CUDA
#error "core/error_cuda.h is only for CUDA builds (MP_WITH_CUDA)"
#endif

namespace mp::detail {
[[noreturn]] void throw_cuda_error(const char* call, int code, const char* file, int line);
[[noreturn]] void throw_cublas_error(const char* call, int status, const char* file, int line);
[[noreturn]] void throw_cudnn_error(const char* call, int status, const char* file, int line);
}  // namespace mp::detail

// Runs `call`; a status other than 0 (cudaSuccess, CUBLAS_STATUS_SUCCESS,
// CUDNN_STATUS_SUCCESS) goes to `thrower` with `text`, the call as written.
#define MP_CHECK_STATUS_(call, text, thrower)                         \
  do {                                                                \
    const int mp_status_rc_ = static_cast<int>(call);                 \
    if (mp_status_rc_ != 0) {                                         \
      ::mp::detail::thrower(text, mp_status_rc_, __FILE__, __LINE__); \
    }                                                                 \
  } while (0)

#define MP_CHECK_CUDA(call) MP_CHECK_STATUS_(call, #call, throw_cuda_error)
#define MP_CHECK_CUBLAS(call) MP_CHECK_STATUS_(call, #call, throw_cublas_error)
// cuDNN 9's cudnnStatus_t: the message names the status's number and its
// category (CUDNN_STATUS_NOT_SUPPORTED for 3000-3999, ...).
#define MP_CHECK_CUDNN(call) MP_CHECK_STATUS_(call, #call, throw_cudnn_error)

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

#define MP_CHECK_CUDA(call)                                                              \
  do {                                                                                   \
    const int mp_cuda_rc_ = static_cast<int>(call);                                      \
    if (mp_cuda_rc_ != 0 /* cudaSuccess */) {                                            \
      ::mp::detail::throw_cuda_error(#call, mp_cuda_rc_, __FILE__, __LINE__);            \
    }                                                                                    \
  } while (0)

#define MP_CHECK_CUBLAS(call)                                                            \
  do {                                                                                   \
    const int mp_cublas_rc_ = static_cast<int>(call);                                    \
    if (mp_cublas_rc_ != 0 /* CUBLAS_STATUS_SUCCESS */) {                                \
      ::mp::detail::throw_cublas_error(#call, mp_cublas_rc_, __FILE__, __LINE__);        \
    }                                                                                    \
  } while (0)

// cuDNN 9's cudnnStatus_t: the message names the status's number and its
// category (CUDNN_STATUS_NOT_SUPPORTED for 3000-3999, ...).
#define MP_CHECK_CUDNN(call)                                                             \
  do {                                                                                   \
    const int mp_cudnn_rc_ = static_cast<int>(call);                                     \
    if (mp_cudnn_rc_ != 0 /* CUDNN_STATUS_SUCCESS */) {                                  \
      ::mp::detail::throw_cudnn_error(#call, mp_cudnn_rc_, __FILE__, __LINE__);          \
    }                                                                                    \
  } while (0)

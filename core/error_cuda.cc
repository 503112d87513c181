#include "core/error_cuda.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>

static_assert(cudaSuccess == 0 && CUBLAS_STATUS_SUCCESS == 0, "check macros compare against 0");

namespace mp::detail {
namespace {

const char* cublas_status_name(int status) {
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

// cuDNN 9 numbers its statuses by category (CUDNN_STATUS_CATEGORY in
// cudnn_graph.h: the thousands); kernels/cuda/attention_cudnn.cc checks these
// numbers against the header it is built with.
const char* cudnn_status_category(int status) {
  switch (status / 1000) {
    case 1: return "CUDNN_STATUS_NOT_INITIALIZED";
    case 2: return "CUDNN_STATUS_BAD_PARAM";
    case 3: return "CUDNN_STATUS_NOT_SUPPORTED";
    case 4: return "CUDNN_STATUS_INTERNAL_ERROR";
    case 5: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "unknown cuDNN status";
  }
}

}  // namespace

void throw_cuda_error(const char* call, int code, const char* file, int line) {
  const auto err = static_cast<cudaError_t>(code);
  int device = -1;
  std::string where;
  // cudaGetDevice itself fails without a driver; only name a device we have.
  if (err != cudaErrorInsufficientDriver && err != cudaErrorNoDevice &&
      cudaGetDevice(&device) == cudaSuccess) {
    where = str(" [device ", device, "]");
  }
  throw CudaError(file, line,
                  str("Call to ", call, " failed: ", cudaGetErrorName(err), " (",
                      cudaGetErrorString(err), ")", where));
}

void throw_cublas_error(const char* call, int status, const char* file, int line) {
  throw CudaError(file, line, str("Call to ", call, " failed: ", cublas_status_name(status),
                                  " (cuBLAS status ", status, ")"));
}

void throw_cudnn_error(const char* call, int status, const char* file, int line) {
  throw CudaError(file, line, str("Call to ", call, " failed: cuDNN status ", status, " (category ",
                                  cudnn_status_category(status), ")"));
}

}  // namespace mp::detail

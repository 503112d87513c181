#include "comm/nccl/nccl_error.h"

#include <nccl.h>

static_assert(ncclSuccess == 0 && ncclInProgress == 7, "MP_CHECK_NCCL compares against 0 and 7");

namespace mp::detail {

void throw_nccl_error(const char* call, int result, const char* file, int line) {
  throw CudaError(file, line,
                  str("Call to ", call, " failed: ",
                      ncclGetErrorString(static_cast<ncclResult_t>(result)), " (NCCL result ",
                      result, ")"));
}

}  // namespace mp::detail

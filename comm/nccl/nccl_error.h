// comm/nccl/nccl_error.h: MP_CHECK_NCCL, the check macro of NCCL calls. It
// throws CudaError naming the call, NCCL's error text, file:line and rank.
// Only for builds with MP_WITH_NCCL.
#pragma once

#include "core/error.h"
#include "mp/config.h"

#if !MP_WITH_NCCL
#error "comm/nccl/nccl_error.h is only for NCCL builds (MP_WITH_NCCL)"
#endif

namespace mp::detail {
[[noreturn]] void throw_nccl_error(const char* call, int result, const char* file, int line);
}  // namespace mp::detail

#define MP_CHECK_NCCL(call)                                                              \
  do {                                                                                   \
    const int mp_nccl_rc_ = static_cast<int>(call);                                      \
    /* ncclInProgress (7) is not an error for non-blocking communicators */              \
    if (mp_nccl_rc_ != 0 /* ncclSuccess */ && mp_nccl_rc_ != 7 /* ncclInProgress */) {   \
      ::mp::detail::throw_nccl_error(#call, mp_nccl_rc_, __FILE__, __LINE__);            \
    }                                                                                    \
  } while (0)

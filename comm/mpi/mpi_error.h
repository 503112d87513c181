// comm/mpi/mpi_error.h: MP_CHECK_MPI(call) throws CommError naming the call,
// MPI's error string, file:line and rank. MPI reports errors to us only on
// communicators whose error handler is MPI_ERRORS_RETURN (launch/ sets it on
// MPI_COMM_WORLD; the default handler aborts the job).
#pragma once

#include "core/error.h"

namespace mp::detail {
[[noreturn]] void throw_mpi_error(const char* call, int code, const char* file, int line);
}  // namespace mp::detail

#define MP_CHECK_MPI(call)                                                     \
  do {                                                                         \
    const int mp_mpi_rc_ = (call);                                             \
    if (mp_mpi_rc_ != 0 /* MPI_SUCCESS */) {                                   \
      ::mp::detail::throw_mpi_error(#call, mp_mpi_rc_, __FILE__, __LINE__);    \
    }                                                                          \
  } while (0)

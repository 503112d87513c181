#include "comm/mpi/mpi_error.h"

#include <mpi.h>

#include <cstdio>

static_assert(MPI_SUCCESS == 0, "MP_CHECK_MPI compares against 0");

namespace mp::detail {

void throw_mpi_error(const char* call, int code, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) {
    std::snprintf(text, sizeof(text), "unknown MPI error");
  }
  throw CommError(file, line, str("Call to ", call, " failed: ", text, " (MPI error ", code, ")"));
}

}  // namespace mp::detail

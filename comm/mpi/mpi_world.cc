#include "comm/mpi/mpi_world.h"

#include "comm/mpi/mpi_error.h"
#include "comm/mpi/tcp_defaults.h"
#include "core/error.h"

namespace mp {

MpiWorld::MpiWorld(int* argc, char*** argv) {
  int initialized = 0;
  MP_CHECK_MPI(MPI_Initialized(&initialized));
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MP_CHECK_MPI(MPI_Query_thread(&provided));
  } else {
    apply_openmpi_tcp_defaults();  // Note [Open MPI over TCP]
    MP_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    finalize_ = true;
  }
  MP_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MP_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MP_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  set_error_rank(rank_);
  if (provided < MPI_THREAD_MULTIPLE) {
    MP_THROW(CommError, "the MPI library provides thread level ", provided,
             " but mp needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
             "): collectives run on communication threads");
  }
  MPI_Comm local = MPI_COMM_NULL;
  MP_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  MP_CHECK_MPI(MPI_Comm_rank(local, &local_rank_));
  MP_CHECK_MPI(MPI_Comm_size(local, &local_size_));
  MP_CHECK_MPI(MPI_Comm_free(&local));
}

MpiWorld::~MpiWorld() {
  if (finalize_) MPI_Finalize();
}

}  // namespace mp

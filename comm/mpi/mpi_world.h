// comm/mpi/mpi_world.h: MPI start-up for mp_worker, the tests and embedding
// hosts: MPI_Init_thread with MPI_THREAD_MULTIPLE (communication threads call
// MPI while the main thread computes), errors returned instead of aborting,
// and the node-local rank from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED),
// which picks each rank's GPU. Ending the job is launch/'s (rank_main.cc):
// library code throws.
#pragma once

#include <mpi.h>

namespace mp {

class MpiWorld {
 public:
  // Initializes MPI unless the host already did (then it is left to the host
  // to finalize). Throws CommError when MPI cannot give MPI_THREAD_MULTIPLE.
  MpiWorld(int* argc, char*** argv);
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  MPI_Comm comm() const { return MPI_COMM_WORLD; }

 private:
  bool finalize_ = false;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
};

}  // namespace mp

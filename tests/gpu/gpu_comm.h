// tests/gpu/gpu_comm.h: the communicator options of the multi-rank GPU
// tests. A collective that does not complete fails within a minute, naming
// what it waits for (Note [Peer monitor]), before the harness's agreement
// timeout (120 s, tests/mpi/mpi_test.h) and well inside a GPU check's test
// stage: a hang there reports itself instead of using up the stage.
#pragma once

#include <chrono>

#include "comm/communicator.h"

namespace mp::testing {

inline CommOptions gpu_test_comm_options() {
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

}  // namespace mp::testing

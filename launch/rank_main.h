// launch/rank_main.h: the exit-code policy every rank program shares
// (mp_worker, mp_bench): start MPI, run the body, and on failure print the
// error on this rank's stderr ("[rank R] file:line: what") and end the whole
// job (MPI_Abort), so no other rank waits for this one forever. An agreed
// error (core/error.h), which every rank throws at the same point, ends
// each rank normally instead, so every rank's message is printed.
// Exit codes: the body's on success; 2 for ConfigError (bad configuration or
// input); 1 for any other failure.
#pragma once

#include <functional>

#include "comm/mpi/mpi_world.h"

namespace mp {

int run_rank_main(const char* program, int* argc, char*** argv,
                  const std::function<int(const MpiWorld&)>& body);

}  // namespace mp

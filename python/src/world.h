// python/src/world.h: MPI in a Python process. init() starts MPI
// (MPI_THREAD_MULTIPLE) unless the host did, after making the MPI library's
// symbols global (a Python extension is loaded RTLD_LOCAL, and Open MPI's
// plugins resolve their symbols against libmpi). finalize() closes every
// engine still open, then ends MPI if init() started it; mp's __init__
// registers it with atexit. A finalize after a collective timed out
// (abandoned communication threads, core/stream.h) leaves MPI alone: the
// process ends without MPI_Finalize rather than hang in it.
#pragma once

#include <functional>

#include "comm/mpi/mpi_world.h"

namespace mp::python {

void init();
void finalize();
bool initialized();
// The world (init() first; ConfigError otherwise).
const MpiWorld& world();

// Engines register a closer, called by finalize() (and unregister it when
// they close themselves). Returns a token for unregister_closer.
int register_closer(std::function<void()> close);
void unregister_closer(int token);

}  // namespace mp::python

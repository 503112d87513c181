// python/src/world.h: the world of a Python process: who it is (Note [Rank
// discovery] in comm/rank_discovery.h) and what carries its data plane.
// Under mpirun (or with no launcher) init() starts MPI (MPI_THREAD_MULTIPLE)
// unless the host did, after making the MPI library's symbols global (a
// Python extension is loaded RTLD_LOCAL, and Open MPI's plugins resolve
// their symbols against libmpi). Under torchrun, srun without MPI, or
// explicit ranks it never starts MPI: the ranks meet through a key-value
// store that mp/_launch.py opens (torchrun's agent's, or one rank 0 starts)
// and the data plane is Gloo (comm/gloo/). finalize() closes every engine
// still open, then ends the world; mp's __init__ registers it with atexit.
// A finalize after a collective timed out (abandoned communication threads,
// core/stream.h) leaves MPI alone: the process ends without MPI_Finalize
// rather than hang in it.
#pragma once

#include <nanobind/nanobind.h>

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/rank_discovery.h"
#include "core/device.h"

namespace mp::python {

// The world of init(): Ranks as the launcher said, completed by MPI where
// MPI runs it (local ranks from MPI_Comm_split_type).
struct World {
  Ranks ranks;
  std::string data_plane;  // "MPI" or "Gloo"
};

// `store` (Gloo only): a Python object with set(key: str, value: bytes) and
// get(key: str, timeout_s: float) -> bytes. Collective. Throws ConfigError
// when the data plane's world size is not the launcher's.
void init(const Ranks& ranks, nanobind::object store, bool use_mpi);
void finalize();
bool initialized();
// The world (init() first; ConfigError otherwise).
const World& world();
// Whether MPI_Init has run in this process (by mp or by the host).
bool mpi_initialized();
// A new communicator over the world for an engine on `device`: MPI's (or
// NCCL / staged, comm/data_plane.h); without MPI Gloo's, or on a GPU NCCL's
// over a Gloo split. Collective.
std::unique_ptr<Communicator> make_world_communicator(Device device, const CommOptions& options, bool shared_devices);

// The world's communicator for small host values (Note [Control plane]):
// MPI's (made on first use, collectively) or the Gloo world's.
Communicator& control();

// Engines register a closer, called by finalize() (and unregister it when
// they close themselves). Returns a token for unregister_closer.
int register_closer(std::function<void()> close);
void unregister_closer(int token);

}  // namespace mp::python

// mp._mp: the Python bindings of mp (python/mp/__init__.py re-exports them).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "mp/mp.h"
#include "python/src/engine.h"
#include "python/src/errors.h"
#include "python/src/world.h"

namespace nb = nanobind;

NB_MODULE(_mp, m) {
  m.doc() = "mp: sharded mixed-precision training (the C++ runtime's bindings)";
  mp::python::bind_errors(m);
  m.def("version", [] { return std::string(mp::version()); }, "The library's version, MAJOR.MINOR.PATCH.");
  m.def("init", &mp::python::init,
        "Starts MPI (MPI_THREAD_MULTIPLE) unless the host did. Collective, as MPI_Init is. "
        "A second call does nothing.");
  m.def("finalize", &mp::python::finalize, "Closes every open engine, then ends MPI if init() started it.");
  m.def("initialized", &mp::python::initialized);
  m.def("rank", [] { return mp::python::world().rank(); }, "This process's rank in the world.");
  m.def("world_size", [] { return mp::python::world().size(); });
  m.def("local_rank", [] { return mp::python::world().local_rank(); }, "The rank among this node's ranks.");
  mp::python::bind_engine(m);
}

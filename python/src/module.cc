// mp._mp: the Python bindings of mp (python/mp/__init__.py re-exports them).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>
#include <vector>

#include "comm/rank_discovery.h"
#include "mp/mp.h"
#include "python/src/engine.h"
#include "python/src/errors.h"
#include "python/src/world.h"

namespace nb = nanobind;

NB_MODULE(_mp, m) {
  using mp::python::world;
  m.doc() = "mp: sharded mixed-precision training (the C++ runtime's bindings)";
  mp::python::bind_errors(m);
  m.def("version", [] { return std::string(mp::version()); }, "The library's version, MAJOR.MINOR.PATCH.");
  nb::class_<mp::Ranks>(m, "Ranks", "Who this process is in its job (Note [Rank discovery]).")
      .def_prop_ro("source", [](const mp::Ranks& r) { return std::string(mp::rank_source_name(r.source)); })
      .def_ro("rank", &mp::Ranks::rank)
      .def_ro("size", &mp::Ranks::size)
      .def_ro("local_rank", &mp::Ranks::local_rank)
      .def_ro("local_size", &mp::Ranks::local_size)
      .def_ro("master_addr", &mp::Ranks::master_addr)
      .def_ro("master_port", &mp::Ranks::master_port)
      .def_ro("agent_store", &mp::Ranks::agent_store)
      .def_prop_ro("uses_mpi", &mp::Ranks::uses_mpi)
      .def("__repr__", &mp::Ranks::describe);
  m.def(
      "discover",
      [](int rank, int world_size, int local_rank, int local_world_size, const std::string& master_addr,
         int master_port) {
        mp::RankArguments a;
        a.rank = rank, a.world_size = world_size, a.local_rank = local_rank, a.local_world_size = local_world_size;
        a.master_addr = master_addr, a.master_port = master_port;
        return mp::discover_ranks(mp::process_environment(), a);
      },
      nb::arg("rank") = -1, nb::arg("world_size") = -1, nb::arg("local_rank") = -1, nb::arg("local_world_size") = -1,
      nb::arg("master_addr") = "", nb::arg("master_port") = 0,
      "Who this process is: the arguments given (-1: not given), else the launcher's environment.");
  m.def("init", &mp::python::init, nb::arg("ranks"), nb::arg("store").none(), nb::arg("use_mpi"),
        "Starts the world (mp.init() calls this): MPI, or Gloo over `store`. Collective.");
  m.def("finalize", &mp::python::finalize, "Closes every open engine, then ends the world (MPI if init() started it).");
  m.def("initialized", &mp::python::initialized);
  m.def("mpi_initialized", &mp::python::mpi_initialized, "Whether MPI_Init has run in this process.");
  m.def("rank", [] { return world().ranks.rank; }, "This process's rank in the world.");
  m.def("world_size", [] { return world().ranks.size; });
  m.def("local_rank", [] { return world().ranks.local_rank; }, "The rank among this node's ranks.");
  m.def("local_world_size", [] { return world().ranks.local_size; }, "The ranks on this node.");
  m.def("launcher", [] { return std::string(mp::rank_source_name(world().ranks.source)); },
        "What said who this process is: 'torchrun', 'MPI', 'Slurm', 'explicit' or 'none'.");
  m.def("data_plane", [] { return world().data_plane; }, "'MPI' or 'Gloo'.");
  m.def(
      "all_gather_bytes",
      [](nb::bytes mine) {
        const std::string bytes(mine.c_str(), mine.size());
        std::vector<std::string> all;
        {
          nb::gil_scoped_release release;
          all = mp::python::control().all_gather_bytes(bytes);
        }
        nb::list out;
        for (const std::string& b : all) out.append(nb::bytes(b.data(), b.size()));
        return out;
      },
      "Every rank's bytes, in rank order: small host values over the world's control plane. Collective.");
  mp::python::bind_engine(m);
}

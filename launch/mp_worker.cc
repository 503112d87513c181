// launch/mp_worker.cc: the training worker, one process per rank:
//   mpirun -np N build/mp_worker      (or launch/mprun -np N build/mp_worker)
// Exit codes: 0 success, 2 bad configuration or input, 1 runtime failure.
// Errors are printed on every rank that saw them, prefixed "[rank R]"; a
// failing rank then aborts the job so no other rank waits for it forever.
#include <CLI/CLI.hpp>
#include <dnnl.h>
#include <google/protobuf/stubs/common.h>

#include <cstdio>
#include <iostream>

#include "launch/mpi_world.h"
#include "launch/rank_info.h"
#include "launch/rank_main.h"
#include "mp/config.h"
#include "runtime/error.h"
#if MP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if MP_WITH_NCCL
#include <nccl.h>
#endif

namespace mp {
namespace {

void print_version() {
  const dnnl_version_t* dnnl = dnnl_version();
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int mpi_len = 0;
  MPI_Get_library_version(mpi, &mpi_len);
  std::string mpi_first_line(mpi, static_cast<size_t>(mpi_len));
  mpi_first_line = mpi_first_line.substr(0, mpi_first_line.find_first_of(",\n"));
  std::cout << "mp_worker " << MP_VERSION << "\n"
            << "build: " << build_string() << "\n"
            << "oneDNN " << dnnl->major << "." << dnnl->minor << "." << dnnl->patch << "\n"
            << "MPI: " << mpi_first_line << "\n"
            << "protobuf " << google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION)
            << "\n";
#if MP_WITH_CUDA
  std::cout << "CUDA runtime " << CUDART_VERSION / 1000 << "." << (CUDART_VERSION % 1000) / 10
            << " (compiled)\n";
#endif
#if MP_WITH_NCCL
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    std::cout << "NCCL " << nccl / 10000 << "." << (nccl / 100) % 100 << "." << nccl % 100 << "\n";
  }
#endif
}

int run(const MpiWorld& world) {
  const Device device = default_device(world.local_rank());
  set_current_device(device);
  const auto infos = gather_rank_infos(world, local_rank_info(world, device));
  if (world.rank() == 0) {
    std::cout << build_string() << ": " << world.size() << " rank(s)\n";
    for (const auto& info : infos) {
      std::cout << "  rank " << info.rank() << ": " << info.hostname() << " pid " << info.pid()
                << ", local rank " << info.local_rank() << "/" << info.local_size() << ", "
                << info.device_description();
      if (!info.cuda_unavailable_reason().empty()) {
        std::cout << " [CUDA unavailable: " << info.cuda_unavailable_reason() << "]";
      }
      std::cout << "\n";
    }
    std::cout << "mp_worker: training is not built yet. Models, data and the training loop "
                 "arrive with issue 6; this run checked MPI start-up, device selection and "
                 "that every rank runs the same build.\n";
  }
  return 0;
}

}  // namespace
}  // namespace mp

int main(int argc, char** argv) {
  CLI::App app{"mp_worker: one rank of a sharded mixed-precision training job.\n"
               "Launch with: launch/mprun -np N build/mp_worker"};
  bool version = false;
  app.add_flag("--version", version, "Print the version and build, then exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (version) {
    mp::print_version();
    return 0;
  }

  return mp::run_rank_main("mp_worker", &argc, &argv, mp::run);
}

#include "comm/data_plane.h"

#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/staged_communicator.h"
#include "mp/config.h"
#if MP_WITH_NCCL
#include "comm/mpi/mpi_context.h"
#include "comm/nccl/nccl_communicator.h"
#endif

namespace mp {

std::unique_ptr<Communicator> make_data_plane(Device device, const CommOptions& options, bool shared_devices,
                                              std::string* description) {
  std::string what = "MPI";
  std::unique_ptr<Communicator> comm;
  if (device.is_cpu()) {
    comm = MpiCommunicator::create_world("world", options);
  } else if (shared_devices || !MP_WITH_NCCL) {
    comm = StagedMpiCommunicator::create(MpiCommunicator::create_world("world", options), device);
    what = shared_devices ? "MPI staged through host memory (ranks share GPUs)"
                          : "MPI staged through host memory (built without NCCL)";
  } else {
#if MP_WITH_NCCL
    auto monitor = std::make_shared<MpiContext>();  // Note [Peer monitor]
    comm = NcclCommunicator::create(MPI_COMM_WORLD, device, "world", options, std::move(monitor));
    what = "NCCL";
#endif
  }
  if (description != nullptr) *description = what;
  return comm;
}

}  // namespace mp

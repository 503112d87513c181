#include "comm/data_plane.h"

#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/staged_communicator.h"
#include "core/error.h"
#include "mp/config.h"
#if MP_WITH_NCCL
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
    comm = make_nccl_world(MpiCommunicator::create_world("world (host)", options), device, options);
    what = "NCCL";
  }
  if (description != nullptr) *description = what;
  return comm;
}

std::unique_ptr<Communicator> make_nccl_world(std::unique_ptr<Communicator> host, Device device,
                                              const CommOptions& options) {
#if MP_WITH_NCCL
  return NcclCommunicator::create(std::move(host), device, "world", options);
#else
  (void)host, (void)options;
  MP_THROW(ConfigError, "an engine on ", device, " without MPI needs NCCL, and this build has none");
#endif
}

}  // namespace mp

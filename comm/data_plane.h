// comm/data_plane.h: the communicator that carries the engine's tensors
// (the data plane, docs/comm.md) for the device a rank computes on.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/device.h"

namespace mp {

// Collective over MPI_COMM_WORLD. The CPU: the MPI world communicator. A
// CUDA device: NCCL (builds with MP_WITH_NCCL, every rank on its own
// device) over an MPI world communicator as its control plane, whose peer
// monitor names the ranks that have not arrived; else, or when ranks share
// devices (`shared_devices`, compute.share_gpus), the staged MPI backend.
// `*description` (when given) := "MPI", "NCCL" or "MPI staged through host
// memory (...)".
std::unique_ptr<Communicator> make_data_plane(Device device, const CommOptions& options, bool shared_devices = false,
                                              std::string* description = nullptr);

// NCCL's world communicator over `host` (its control plane, collective over
// it: comm/nccl/nccl_communicator.h). ConfigError in builds without NCCL.
std::unique_ptr<Communicator> make_nccl_world(std::unique_ptr<Communicator> host, Device device,
                                              const CommOptions& options);

}  // namespace mp

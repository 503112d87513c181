// launch/device_choice.h: where a rank computes (compute.device).
//
// Note [Device choice]
// - AUTO takes CUDA device `local rank` when the node shows at least one
//   CUDA device per local rank (both built-in models compute on either);
//   otherwise the CPU, and the choice's note says why in one line for the
//   run log ("compute.device AUTO: the CPU (no CUDA device visible)").
//   Sharing a GPU between ranks is never chosen silently.
// - CUDA demands the same and throws ConfigError naming the rank and the
//   reason otherwise: built without CUDA, no usable driver, no device, or
//   fewer devices than local ranks.
// - compute.share_gpus: fewer devices than local ranks is no reason against
//   CUDA; rank r takes device local_rank % count, and `shared` says so (the
//   data plane must then be the staged MPI backend: NCCL needs a device per
//   rank).
// - CPU is the CPU, whatever the node has.
// Each rank decides from its own node's facts; the trainer then checks that
// every rank chose the same kind of device (a job does not mix CPU and CUDA
// ranks: their data planes differ).
#pragma once

#include <string>

#include "core/device.h"
#include "proto/mp.pb.h"

namespace mp {

struct DeviceChoice {
  Device device;
  std::string note;     // one line for the run log; empty when CUDA was requested and taken alone
  bool shared = false;  // CUDA devices shared between this node's ranks (compute.share_gpus)
};

// `cuda`: the node's CUDA facts (cuda_info()).
DeviceChoice choose_device(proto::ComputeConfig::Device requested, int rank, int local_rank,
                           int local_size, const CudaInfo& cuda, bool share_gpus = false);
// choose_device for `compute` and this node's CUDA, the device made current.
DeviceChoice use_device(const proto::ComputeConfig& compute, int rank, int local_rank, int local_size);

// "AUTO", "CPU", "CUDA".
std::string device_request_name(proto::ComputeConfig::Device requested);

}  // namespace mp

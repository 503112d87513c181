#include "launch/device_choice.h"

#include "core/error.h"

namespace mp {

std::string device_request_name(proto::ComputeConfig::Device requested) {
  return proto::ComputeConfig::Device_Name(requested);
}

DeviceChoice choose_device(proto::ComputeConfig::Device requested, bool device_kernels, int rank, int local_rank,
                           int local_size, const CudaInfo& cuda) {
  MP_ENFORCE(local_rank >= 0 && local_rank < local_size, "local rank ", local_rank, " of ", local_size);
  if (requested == proto::ComputeConfig::CPU) return DeviceChoice{Device::cpu(), "compute.device CPU: the CPU"};
  // Why this rank cannot compute on CUDA; empty when it can.
  std::string why;
  if (!device_kernels) {
    why = "the model (model.mlp) computes on the host only";
  } else if (cuda.device_count == 0) {
    why = cuda.unavailable_reason.empty() ? std::string("no CUDA device visible") : cuda.unavailable_reason;
  } else if (cuda.device_count < local_size) {
    why = detail::str("this node shows ", cuda.device_count, " CUDA device(s) for ", local_size,
                      " local ranks (one GPU per rank: start at most ", cuda.device_count,
                      " ranks per node, or show more devices in CUDA_VISIBLE_DEVICES)");
  }
  if (requested == proto::ComputeConfig::CUDA) {
    if (!why.empty()) MP_THROW(ConfigError, "rank ", rank, ": compute.device = CUDA, but ", why);
    return DeviceChoice{Device::cuda(local_rank), ""};
  }
  if (!why.empty()) return DeviceChoice{Device::cpu(), "compute.device AUTO: the CPU (" + why + ")"};
  return DeviceChoice{Device::cuda(local_rank),
                      detail::str("compute.device AUTO: CUDA device ", local_rank, " of ", cuda.device_count)};
}

}  // namespace mp

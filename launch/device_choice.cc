#include "launch/device_choice.h"

#include "core/error.h"

namespace mp {

std::string device_request_name(proto::ComputeConfig::Device requested) {
  return proto::ComputeConfig::Device_Name(requested);
}

DeviceChoice choose_device(proto::ComputeConfig::Device requested, int rank, int local_rank,
                           int local_size, const CudaInfo& cuda, bool share_gpus) {
  MP_ENFORCE(local_rank >= 0 && local_rank < local_size, "local rank ", local_rank, " of ", local_size);
  if (requested == proto::ComputeConfig::CPU) return DeviceChoice{Device::cpu(), "compute.device CPU: the CPU"};
  // Why this rank cannot compute on CUDA; empty when it can.
  std::string why;
  if (cuda.device_count == 0) {
    why = cuda.unavailable_reason.empty() ? std::string("no CUDA device visible") : cuda.unavailable_reason;
  } else if (cuda.device_count < local_size && !share_gpus) {
    why = detail::str("this node shows ", cuda.device_count, " CUDA device(s) for ", local_size,
                      " local ranks (one GPU per rank: start at most ", cuda.device_count,
                      " ranks per node, or show more devices in CUDA_VISIBLE_DEVICES)");
  }
  if (requested == proto::ComputeConfig::CUDA && !why.empty()) {
    MP_THROW(ConfigError, "rank ", rank, ": compute.device = CUDA, but ", why);
  }
  if (!why.empty()) return DeviceChoice{Device::cpu(), "compute.device AUTO: the CPU (" + why + ")"};
  const bool shared = cuda.device_count < local_size;
  const int index = local_rank % cuda.device_count;
  std::string note = requested == proto::ComputeConfig::AUTO
                         ? detail::str("compute.device AUTO: CUDA device ", index, " of ", cuda.device_count)
                         : std::string();
  if (shared) {
    note += detail::str(note.empty() ? "" : "; ", local_size, " local ranks share ", cuda.device_count,
                        " CUDA device(s) (compute.share_gpus)");
  }
  return DeviceChoice{Device::cuda(index), note, shared};
}

DeviceChoice use_device(const proto::ComputeConfig& compute, int rank, int local_rank, int local_size) {
  DeviceChoice choice =
      choose_device(compute.device(), rank, local_rank, local_size, cuda_info(), compute.share_gpus());
  set_current_device(choice.device);
  return choice;
}

}  // namespace mp

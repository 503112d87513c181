#include "launch/rank_info.h"

#include <unistd.h>

#include <climits>

#include "core/error.h"
#include "mp/config.h"

namespace mp {

std::string build_string() {
  return detail::str("mp ", MP_VERSION, " cuda=", MP_WITH_CUDA, " nccl=", MP_WITH_NCCL,
                     " sanitize=", MP_SANITIZE);
}

proto::RankInfo local_rank_info(const MpiWorld& world, Device device) {
  proto::RankInfo info;
  info.set_rank(world.rank());
  info.set_local_rank(world.local_rank());
  info.set_local_size(world.local_size());
  char host[HOST_NAME_MAX + 1] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  info.set_hostname(host);
  info.set_pid(static_cast<int64_t>(getpid()));
  info.set_device(to_string(device));
  info.set_device_description(describe_device(device));
  const CudaInfo cuda = cuda_info();
  info.set_cuda_unavailable_reason(cuda.unavailable_reason);
  info.set_build(build_string());
  return info;
}

std::vector<proto::RankInfo> gather_rank_infos(Communicator& world, const proto::RankInfo& mine) {
  const std::vector<std::string> all = world.all_gather_bytes(mine.SerializeAsString());
  std::vector<proto::RankInfo> infos(all.size());
  std::string mismatch;  // the same verdict on every rank: each reads every info
  for (size_t r = 0; r < all.size(); ++r) {
    MP_ENFORCE(infos[r].ParseFromString(all[r]), "rank ", r, " sent an unreadable RankInfo");
    if (infos[r].build() != infos[0].build()) {
      mismatch += detail::str(mismatch.empty() ? "" : "; ", "rank ", r, " on ", infos[r].hostname(), " runs '",
                              infos[r].build(), "'");
    }
  }
  if (!mismatch.empty()) {
    MP_THROW(ConfigError, "the ranks run different builds of mp: rank 0 runs '", infos[0].build(), "'; ", mismatch);
  }
  return infos;
}

}  // namespace mp

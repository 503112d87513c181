#include "launch/rank_info.h"

#include <unistd.h>

#include <climits>

#include "mp/config.h"
#include "core/error.h"
#include "comm/mpi/mpi_error.h"

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

std::vector<proto::RankInfo> gather_rank_infos(const MpiWorld& world, const proto::RankInfo& mine) {
  const std::string bytes = mine.SerializeAsString();
  MP_ENFORCE_LE(bytes.size(), static_cast<size_t>(INT_MAX));
  const int my_size = static_cast<int>(bytes.size());
  const bool root = world.rank() == 0;
  std::vector<int> sizes(root ? world.size() : 0), offsets(root ? world.size() : 0);
  MP_CHECK_MPI(MPI_Gather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, world.comm()));
  std::string all;
  if (root) {
    long total = 0;
    for (int r = 0; r < world.size(); ++r) {
      offsets[r] = static_cast<int>(total);
      total += sizes[r];
      MP_ENFORCE_LE(total, INT_MAX, "rank infos too large to gather");
    }
    all.resize(static_cast<size_t>(total));
  }
  MP_CHECK_MPI(MPI_Gatherv(bytes.data(), my_size, MPI_BYTE, all.data(), sizes.data(),
                           offsets.data(), MPI_BYTE, 0, world.comm()));

  std::vector<proto::RankInfo> infos;
  std::string mismatch;  // rank 0's verdict, shared with every rank
  if (root) {
    infos.resize(world.size());
    for (int r = 0; r < world.size(); ++r) {
      MP_ENFORCE(infos[r].ParseFromArray(all.data() + offsets[r], sizes[r]),
                 "rank ", r, " sent an unreadable RankInfo");
      if (infos[r].build() != mine.build()) {
        mismatch += detail::str(mismatch.empty() ? "" : "; ", "rank ", r, " on ",
                                infos[r].hostname(), " runs '", infos[r].build(), "'");
      }
    }
    if (!mismatch.empty()) mismatch = "rank 0 runs '" + mine.build() + "'; " + mismatch;
  }
  int mismatch_size = static_cast<int>(mismatch.size());
  MP_CHECK_MPI(MPI_Bcast(&mismatch_size, 1, MPI_INT, 0, world.comm()));
  mismatch.resize(static_cast<size_t>(mismatch_size));
  MP_CHECK_MPI(MPI_Bcast(mismatch.data(), mismatch_size, MPI_CHAR, 0, world.comm()));
  if (!mismatch.empty()) {
    MP_THROW(ConfigError, "the ranks run different builds of mp: ", mismatch);
  }
  return infos;
}

}  // namespace mp

// launch/rank_info.h: what each rank of a job runs on, gathered on rank 0.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi/mpi_world.h"
#include "core/device.h"
#include "proto/mp.pb.h"

namespace mp {

// "mp 0.1.0 cuda=1 nccl=1 sanitize=0": identifies the build; every rank of a
// job must run the same one.
std::string build_string();

proto::RankInfo local_rank_info(const MpiWorld& world, Device device);

// Collective over `world` (the control plane, Note [Control plane]): every
// rank passes its own info and gets all of them in rank order. Throws
// ConfigError on every rank when the ranks run different builds, naming them.
std::vector<proto::RankInfo> gather_rank_infos(Communicator& world, const proto::RankInfo& mine);

}  // namespace mp

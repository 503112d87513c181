// comm/mpi/tcp_defaults.h: the settings of Open MPI's TCP transport that mp
// starts every rank with, unless the environment sets them.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mp {

// Note [Open MPI over TCP]
// Two defaults of Open MPI's TCP transport (btl tcp) left half of a link
// unused in mp's collectives across hosts (docs/multinode.md):
//  - btl_tcp_links = 2. A pair of ranks shares one TCP connection by
//    default, and an exchange of 32 MiB each way at 1 Gbit/s then ran at
//    0.50 of the link; with 2 connections at 0.96, as plain TCP.
//  - btl_tcp_eager_limit = btl_tcp_rndv_eager_limit = btl_tcp_max_send_size
//    = 1 MiB + 64 KiB. Above the eager limit (64 KiB by default) a message
//    waits for a rendezvous: the receiver's answer crosses its own link,
//    queued behind the data it is sending. The fp32-accumulating
//    reduction's rounds (Note [Chunked reduction]) are at most 1 MiB to each
//    rank at the default comm.accumulate_chunk_bytes, and with a rendezvous
//    for each a reduce-scatter of 64 MiB across 4 hosts at 1 Gbit/s ran at
//    0.70 of the link; sent eagerly, at 0.98. An eager message that arrives
//    before its receive is posted waits in the receiver's memory. The
//    reduction's rounds bound that to two rounds per peer (less than
//    comm.accumulate_chunk_bytes in all), and the ring all-gather to one
//    piece per round, eager only up to 1 MiB; its larger pieces (up to
//    16 MiB) wait for the rendezvous. A rank's peak memory grew by about
//    5 MiB (GPT-2 124M, 2 hosts x 2 ranks).
// A variable already in the environment (OMPI_MCA_<name>, set by the user,
// mpirun -x or srun) is kept. The eager limit must be the same on every
// rank; every rank runs this before MPI_Init. A host that starts MPI itself
// (mpi4py, an embedding trainer) starts it without them: it sets the
// variables, or exports them, to get them.
std::vector<std::pair<std::string, std::string>> openmpi_tcp_defaults();

// Sets each default not already in the environment. Before MPI_Init only:
// Open MPI reads its parameters there.
void apply_openmpi_tcp_defaults();

}  // namespace mp

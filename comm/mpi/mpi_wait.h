#pragma once
// Waiting for MPI requests without Open MPI's unbounded sched_yield spin
// (Note [Waiting on MPI]).

#include <mpi.h>

#include <cstddef>

namespace mp {

// Note [Waiting on MPI]: every wait of this library on MPI polls its
// requests with MPI_Test*, yielding between polls for its first 5 ms and
// sleeping 50 us between them after that, and its collectives are the
// nonblocking ones waited for the same way (what still blocks: creating
// communicators at setup, and the diagnosis's few-word eager sends). Open
// MPI's own waits (MPI_Wait*, and the blocking collectives built on them)
// spin on sched_yield for as long as they wait. Where ranks outnumber
// cores, as on an emulated cluster of 2 hosts x 2 ranks on 2 cores, the
// spinning threads starved the ones with work for seconds: 1000 steps of a
// small GPT-2 had steps of up to 26 s where the median was 18 ms, and the
// communication timeout (6 s) fired with every rank inside the same
// collective. With these waits the worst step of 1000 was 76-128 ms, and a
// training step on one host is as fast as with spinning waits
// (docs/multinode.md).

// Completes `n` requests; CommError (through MP_CHECK_MPI) on failure.
void mpi_wait_all(int n, MPI_Request* reqs);
inline void mpi_wait(MPI_Request* req) { mpi_wait_all(1, req); }

// Note [Progress while copying]: Open MPI's TCP transport moves a large
// message only inside MPI calls (each call sends and reads what the sockets
// take), so a rank that copies 64 MiB (5-10 ms) between two calls leaves its
// link idle once the socket buffers (a few ms at 10 Gbit/s) are drained or
// full. This copies `bytes` from `src` to `dst` a slice (1 MiB) at a time,
// testing the `n` requests in flight (MPI_Testall) after each slice. Once
// all of them have completed they are MPI_REQUEST_NULL, which the caller's
// wait that follows passes over. A ring all-gather at 64 MiB on 2 hosts at
// 10 Gbit/s took 64.6-83.2 ms this way against 71.8-87.8 ms copying first
// (docs/multinode.md).
void mpi_copy_progressing(void* dst, const void* src, size_t bytes, int n, MPI_Request* reqs);

}  // namespace mp

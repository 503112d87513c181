// bench/gpt_setup.h: what the GPT suites (gpt_bench.cc, muon_bench.cc)
// share: their two models and each rank's threads.
#pragma once

#include "comm/mpi/mpi_world.h"
#include "models/gpt.h"

namespace mp::bench {

// GPT-2 124M at T = 64 (vocab 50257, padded to 50304; 768 channels, 12
// heads, 12 layers), and a small GPT (vocab 256, T 64, 128 channels, 4
// heads, 4 layers). Batch, threads and GEMM dtype are the suite's.
GptConfig gpt2_124m_bench_config();
GptConfig small_gpt_bench_config();

// Threads per rank: MP_NUM_THREADS if set, else the CPUs this rank may run
// on divided by the ranks on the node (launch with --bind-to none).
int threads_per_rank(const MpiWorld& world);

}  // namespace mp::bench

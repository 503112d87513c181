// kernels/cuda/update_cuda.h: the fused optimizer step on a CUDA device, the
// twin of fused_update_cpu (kernels/cpu/update.h): the same arguments, the
// same element math (kernels/update_math.h) and the same bits.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/update_args.h"

namespace mp {

// One launch over the whole flat shard (64-bit indices, no tensor-list
// caps), 16-byte loads and stores when every array is 16-byte aligned.
// Every pointer in `args`, the range table included, is device memory;
// `scalars` too: the kernel reads the learning rate, gradient multiplier,
// step and found_inf there, so the host never waits for them. The table is
// not checked here (it is device memory): build it on the host, where
// Optimizer::ranges_for and fused_update_cpu's rules apply. args.threads
// and args.isa are ignored. Asynchronous on `stream`; argument errors throw
// EnforceError here, launch failures CudaError.
void fused_update_cuda(const UpdateArgs& args, const StepScalars* scalars, cudaStream_t stream);

}  // namespace mp

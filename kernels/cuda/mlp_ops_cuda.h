// kernels/cuda/mlp_ops_cuda.h: the MLP's element kernels on a CUDA device
// (its GEMMs are gemm_cuda, its loss the GPT's softmax kernels): the device
// twins of the tanh parts of kernels/cpu/mlp_ops.h. Device pointers;
// asynchronous on `stream`; a launch failure throws CudaError.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mp {

// y[i] := tanh(y[i]) (CUDA's tanhf; the CPU's std::tanh may differ in the
// last bit).
void mlp_tanh_forward_cuda(float* y, int64_t n, cudaStream_t stream);

// dy[i] := math::tanh_backward(dy[i], y[i]) = dy (1 - y^2): the same bits
// as the CPU loop.
void mlp_tanh_backward_cuda(const float* y, float* dy, int64_t n, cudaStream_t stream);

}  // namespace mp

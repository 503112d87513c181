// kernels/nn/dense.h: the MLP's layers and loss as ops on a stream (Note
// [Op dispatch] in kernels/dispatch.h). A layer is y = x w^T + b, then
// tanh for a hidden layer; w is stored [out, in] (torch.nn.Linear's
// layout), x [batch, in] and y [batch, out] row-major. CPU bodies:
// kernels/cpu/mlp_ops.h (fp32 loops); CUDA bodies: gemm_cuda in fp32 and
// kernels/cuda/mlp_ops_cuda.h.
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"

namespace mp::nn {

struct Dense {
  int64_t batch = 0, in = 0, out = 0;
  bool hidden = false;  // tanh after the product
};

void dense_forward(const OpContext& cx, const Dense& d, const float* x, const float* w, const float* b, float* y);

// Scratch of dense_backward on `device` (0 on the CPU).
int64_t dense_backward_workspace_bytes(Device device, int64_t batch, int64_t out);

// From dy = d loss / d y (overwritten with d loss / d (x w^T + b)):
// overwrites dw and db, and dx with d loss / d x unless dx is null (w is
// read only for dx).
void dense_backward(const OpContext& cx, const Dense& d, const float* x, const float* w, const float* y, float* dy,
                    float* dw, float* db, float* dx, void* workspace);

// The mean cross-entropy of softmax(logits [batch, classes]) at labels into
// *mean (device memory), and its gradient into dlogits. row_loss [batch] is
// scratch. A label outside [0, classes) fails the op (CPU) or gives NaN
// (CUDA).
void dense_loss(const OpContext& cx, const float* logits, const int32_t* labels, int64_t batch, int64_t classes,
                float* dlogits, float* row_loss, double* mean);

}  // namespace mp::nn

// kernels/cpu/mlp_ops.h: the MLP's layer math on the CPU, written once as
// templates over the scalar (float for the model's CPU ops, double for the
// reference tests; both instantiated in mlp_ops.cc). Every output element
// is computed by one thread in a fixed order, so results are bitwise
// identical for any thread count. The model's ops (kernels/nn/dense.h) run
// these on a CPU stream; the CUDA bodies are GEMMs and
// kernels/cuda/mlp_ops_cuda.h.
#pragma once

#include <cstdint>

namespace mp {

// Row-major: x [batch, in], w [out, in], b [out], y [batch, out].

// y = x w^T + b, then tanh if `hidden`.
template <class T>
void mlp_layer_forward(const T* x, const T* w, const T* b, int64_t batch, int64_t in, int64_t out,
                       bool hidden, T* y, int threads);

// Mean cross-entropy of softmax(logits) against labels; dlogits := its
// gradient with respect to the logits.
template <class T>
double mlp_softmax_xent(const T* logits, const int32_t* labels, int64_t batch, int64_t classes,
                        T* dlogits);

// Given dy = d loss / d y (y the layer's output, after tanh if `hidden`),
// overwrites dw and db with the parameters' gradients and, unless dx is null,
// dx with d loss / d x (w is read only for dx, and may be null without it).
// dy is overwritten (with d loss / d(x w^T + b)).
template <class T>
void mlp_layer_backward(const T* x, const T* w, const T* y, T* dy, int64_t batch, int64_t in,
                        int64_t out, bool hidden, T* dw, T* db, T* dx, int threads);

}  // namespace mp

// kernels/cpu/mlp_ops.cc: the MLP's layer math on the CPU (kernels/cpu/mlp_ops.h).
#include "kernels/cpu/mlp_ops.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/loops.h"
#include "kernels/mlp_math.h"

namespace mp {
namespace {

// Columns of dx one tile of the input-gradient loop keeps in cache.
constexpr int64_t kDxTile = 256;

}  // namespace

template <class T>
void mlp_layer_forward(const T* x, const T* w, const T* b, int64_t batch, int64_t in, int64_t out,
                       bool hidden, T* y, int threads) {
  parallel_for(out, threads, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const T* wo = w + o * in;
      for (int64_t r = 0; r < batch; ++r) {
        const T z = b[o] + dot(x + r * in, wo, in);
        y[r * out + o] = hidden ? std::tanh(z) : z;
      }
    }
  });
}

template <class T>
double mlp_softmax_xent(const T* logits, const int32_t* labels, int64_t batch, int64_t classes,
                        T* dlogits) {
  const T inv_batch = T(1) / static_cast<T>(batch);
  double total = 0.0;
  for (int64_t r = 0; r < batch; ++r) {
    const T* z = logits + r * classes;
    T* dz = dlogits + r * classes;
    const int32_t label = labels[r];
    MP_ENFORCE(label >= 0 && label < classes, "label ", label, " of row ", r, " with ", classes, " classes");
    total += static_cast<double>(softmax_xent_row(z, classes, label, inv_batch, dz));
  }
  return total / static_cast<double>(batch);
}

template <class T>
void mlp_layer_backward(const T* x, const T* w, const T* y, T* dy, int64_t batch, int64_t in,
                        int64_t out, bool hidden, T* dw, T* db, T* dx, int threads) {
  // dz := dy * tanh'(z), then dw, db: the thread owning output o owns column o of dz.
  parallel_for(out, threads, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      T* dwo = dw + o * in;
      std::fill(dwo, dwo + in, T(0));
      T bias_grad = 0;
      for (int64_t r = 0; r < batch; ++r) {
        T& dz = dy[r * out + o];
        if (hidden) dz = math::tanh_backward(dz, y[r * out + o]);
        bias_grad += dz;
        axpy(dz, x + r * in, dwo, in);
      }
      db[o] = bias_grad;
    }
  });
  if (dx == nullptr) return;
  // dx = dz w: the thread owning columns [j0, j1) of dx sums over o in order.
  parallel_for(in, threads, 16, [&](int64_t j0, int64_t j1) {
    for (int64_t t0 = j0; t0 < j1; t0 += kDxTile) {
      const int64_t t1 = std::min(j1, t0 + kDxTile);
      for (int64_t r = 0; r < batch; ++r) std::fill(dx + r * in + t0, dx + r * in + t1, T(0));
      for (int64_t o = 0; o < out; ++o) {
        const T* wo = w + o * in;
        for (int64_t r = 0; r < batch; ++r) axpy(dy[r * out + o], wo + t0, dx + r * in + t0, t1 - t0);
      }
    }
  });
}

#define MP_MLP_OPS_INSTANTIATE(T)                                                                  \
  template void mlp_layer_forward<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t, bool, \
                                     T*, int);                                                     \
  template double mlp_softmax_xent<T>(const T*, const int32_t*, int64_t, int64_t, T*);              \
  template void mlp_layer_backward<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t,  \
                                      bool, T*, T*, T*, int);
MP_MLP_OPS_INSTANTIATE(float)
MP_MLP_OPS_INSTANTIATE(double)
#undef MP_MLP_OPS_INSTANTIATE

}  // namespace mp

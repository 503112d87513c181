// kernels/cpu/loops.h: fixed-order CPU loops the built-in models share: dot
// products and axpy whose order depends only on the length, and the softmax
// cross-entropy of one row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace mp {
// In a per-ISA object (kernels/cpu/layer_loops_<isa>.cc defines
// MP_LOOPS_PRIVATE) these helpers are private to the object, so no
// out-of-line copy compiled for a wider ISA can be picked by the linker for
// callers on CPUs without it (tests/check_isa_objects.cmake).
#if defined(MP_LOOPS_PRIVATE)
namespace {
#endif

// The sum of term(j) for j in [0, n) with eight fixed partial sums: the order
// depends only on n, and the lanes vectorize without reassociation.
template <class T, class Term>
T reduce8(int64_t n, Term term) {
  T acc[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += term(j + k);
  }
  for (; j < n; ++j) acc[0] += term(j);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  return reduce8<T>(n, [&](int64_t j) { return a[j] * b[j]; });
}

// y[j] += a * x[j]. Blocks of eight so GCC's -O2 cost model vectorizes it;
// each element is still one multiply and one add, as in a plain loop.
template <class T>
void axpy(T a, const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int k = 0; k < 8; ++k) y[j + k] += a * x[j + k];
  }
  for (; j < n; ++j) y[j] += a * x[j];
}

// One row of softmax cross-entropy over z[0, classes): writes
// dz[c] = (softmax(z)[c] - [c == target]) * scale and returns the row's loss,
// log(sum exp z) - z[target], computed with the max subtracted. `exp` is
// std::exp unless the caller brings a vectorizable one (the GPT's float path).
struct StdExp {
  template <class T>
  T operator()(T x) const {
    return std::exp(x);
  }
};

template <class T, class Exp = StdExp>
T softmax_xent_row(const T* z, int64_t classes, int32_t target, T scale, T* dz, Exp exp = Exp()) {
  const T z_target = z[target];  // read first: dz may be z itself (in place)
  T m = z[0];
  for (int64_t c = 1; c < classes; ++c) m = std::max(m, z[c]);
  for (int64_t c = 0; c < classes; ++c) dz[c] = exp(z[c] - m);
  T sum = 0;
  for (int64_t c = 0; c < classes; ++c) sum += dz[c];
  const T inv_sum = T(1) / sum;
  for (int64_t c = 0; c < classes; ++c) dz[c] = dz[c] * inv_sum * scale;
  dz[target] -= scale;
  return std::log(sum) + m - z_target;
}

#if defined(MP_LOOPS_PRIVATE)
}  // namespace
#endif
}  // namespace mp

#include "kernels/cpu/newton_schulz.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/grad_stats.h"
#include "kernels/cpu/layer_loops.h"
#include "kernels/gemm_problem.h"
#include "kernels/newton_schulz.h"
#include "kernels/newton_schulz_math.h"

namespace mp {
namespace {

// Each part of the scratch starts a multiple of 16 floats (64 bytes) after
// the scratch's start.
constexpr int64_t kAlignFloats = 16;

int64_t aligned_floats(int64_t floats) { return (floats + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// Where the parts of the scratch lie, for X [m, n] (m <= n).
struct Layout {
  int64_t m = 0, n = 0;
  int64_t x = 0, a = 0, b = 0, p = 0, gemm = 0;  // offsets in floats
  int64_t gemm_elements = 0, total = 0;
};

Layout layout_of(int64_t rows, int64_t cols, DType s) {
  Layout l;
  l.m = std::min(rows, cols);
  l.n = std::max(rows, cols);
  const int64_t per_float = s == DType::kBF16 ? 2 : 1;  // elements of s per float
  auto floats = [&](int64_t elements) { return aligned_floats((elements + per_float - 1) / per_float); };
  l.x = 0;
  l.a = l.x + floats(l.m * l.n);
  l.b = l.a + floats(l.m * l.m);
  l.p = l.b + floats(l.m * l.m);
  l.gemm = l.p + aligned_floats(l.m * l.n);
  const NsProducts q = ns_products(l.m, l.n, s);
  l.gemm_elements = std::max(
      {gemm_scratch_elements(q.gram), gemm_scratch_elements(q.square), gemm_scratch_elements(q.apply)});
  l.total = l.gemm + l.gemm_elements;
  return l;
}


// f(i) for every element i of a [rows, cols] matrix, split over whole rows:
// every element is written by one thread, by the same formula, so the split
// does not change any bit.
template <class F>
void for_elements(int64_t rows, int64_t cols, int threads, const F& f) {
  parallel_for(rows, threads, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * cols; i < r1 * cols; ++i) f(i);
  });
}

// dst [rows, cols] = convert(src^T), src stored [cols, rows]: blocks of 32
// x 32, so that both sides stay in cache; split over dst's rows.
template <class Src, class Dst, class Convert>
void transpose_into(const Src* src, Dst* dst, int64_t rows, int64_t cols, int threads, const Convert& convert) {
  constexpr int64_t kTile = 32;
  parallel_for((rows + kTile - 1) / kTile, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t i0 = t0 * kTile; i0 < std::min(rows, t1 * kTile); i0 += kTile) {
      const int64_t i1 = std::min(rows, i0 + kTile);
      for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
        const int64_t j1 = std::min(cols, j0 + kTile);
        for (int64_t i = i0; i < i1; ++i) {
          for (int64_t j = j0; j < j1; ++j) dst[i * cols + j] = convert(src[j * rows + i]);
        }
      }
    }
  });
}

// dst [rows, cols] = convert(src), or convert(src^T) (src stored [cols,
// rows]) when transposed.
template <class Src, class Dst, class Convert>
void convert_into(const Src* src, Dst* dst, int64_t rows, int64_t cols, bool transposed, int threads,
                  const Convert& convert) {
  if (transposed) return transpose_into(src, dst, rows, cols, threads, convert);
  for_elements(rows, cols, threads, [&](int64_t i) { dst[i] = convert(src[i]); });
}

template <class T>
void iterate(const float* g, float* out, int64_t rows, int64_t cols, const NewtonSchulzOptions& o, const Layout& l,
             float* scratch) {
  constexpr DType s = dtype_of_v<T>;
  const int64_t m = l.m, n = l.n;
  const bool transposed = rows > cols;
  T* x = reinterpret_cast<T*>(scratch + l.x);
  T* a = reinterpret_cast<T*>(scratch + l.a);
  T* b = reinterpret_cast<T*>(scratch + l.b);
  float* p = scratch + l.p;
  GemmOptions gopt;
  gopt.threads = o.threads;
  gopt.scratch = l.gemm_elements > 0 ? scratch + l.gemm : nullptr;
  gopt.scratch_elements = l.gemm_elements;

  // X [m, n] = round_s(G) (G [m, n]), or round_s(G^T) (G [n, m]).
  convert_into(g, x, m, n, transposed, o.threads, [](float v) { return math::from_f32<T>(v); });

  // X /= max(||X||_F, eps), the norm and eps rounded to s as torch's are.
  const GradStats stats = grad_stats_cpu(x, s, m * n, 1.0f);
  const float d = ns_divisor<T>(stats.sum_sq, stats.non_finite, o.eps);
  for_elements(m, n, o.threads, [&](int64_t i) { x[i] = ns_scaled(x[i], d); });

  const float ca = static_cast<float>(o.a), cb = static_cast<float>(o.b), cc = static_cast<float>(o.c);
  const NsProducts q = ns_products(m, n, s, x, a, b, p);
  for (int step = 0; step < o.steps; ++step) {
    gemm_cpu(q.gram, gopt);    // A = round_s(X X^T)
    gemm_cpu(q.square, gopt);  // P = A A (fp32)
    for_elements(m, m, o.threads, [&](int64_t i) { b[i] = ns_combine_b(a[i], p[i], cb, cc); });
    gemm_cpu(q.apply, gopt);   // P = B X (fp32)
    for_elements(m, n, o.threads, [&](int64_t i) { x[i] = ns_combine_x(x[i], p[i], ca); });
  }

  // out = X (out [m, n]) or X^T (out [n, m]).
  convert_into(x, out, transposed ? n : m, transposed ? m : n, transposed, o.threads,
               [](T v) { return math::to_f32(v); });
}

}  // namespace

int64_t newton_schulz_scratch_elements(int64_t rows, int64_t cols, const NewtonSchulzOptions& options) {
  check_newton_schulz(rows, cols, options);
  return layout_of(rows, cols, options.dtype).total;
}

void newton_schulz_cpu(const float* g, float* out, int64_t rows, int64_t cols, const NewtonSchulzOptions& options,
                       float* scratch, int64_t scratch_elements) {
  check_newton_schulz(rows, cols, options);
  MP_ENFORCE(g != nullptr && out != nullptr, "newton_schulz: null matrix");
  const Layout l = layout_of(rows, cols, options.dtype);
  if (scratch == nullptr) {
    scratch = thread_floats(ThreadFloats::kNewtonSchulz, l.total);
  } else {
    MP_ENFORCE(scratch_elements >= l.total, "newton_schulz: scratch of ", scratch_elements, " floats for a [", rows,
               ", ", cols, "] matrix in ", dtype_name(options.dtype), ", needs ", l.total);
  }
  if (options.dtype == DType::kBF16) {
    iterate<bf16>(g, out, rows, cols, options, l, scratch);
  } else {
    iterate<float>(g, out, rows, cols, options, l, scratch);
  }
}

}  // namespace mp

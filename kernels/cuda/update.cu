// kernels/cuda/update.cu: the fused optimizer step on CUDA devices. One
// grid-stride kernel per loop variant (the CPU's set, kernels/cpu/
// update_span.h); the element math is math::update_element, shared with the
// CPU loops. Built with --fmad=false, so the bits match the CPU's. No
// instance has a stack frame (tests/ptxas_hot_kernels.txt): packs of 8
// elements stay in registers from their 16-byte loads to their stores.
#include <algorithm>

#include "core/error.h"
#include "core/error_cuda.h"
#include "kernels/cpu/update_span.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/update_cuda.h"

namespace mp {
namespace {

using detail::SpanArgs;
using detail::SpanVariant;
using math::CopyMode;

// Elements per thread per iteration on the vector path: one 16-byte access
// of each 2-byte array, two of each fp32 array.
constexpr int kVec = 8;

template <class T>
struct alignas(16) Pack {
  T v[kVec];
};

// Rule's constants for the range holding element i, recomputed only when i
// leaves the cached range (a thread walks its elements in increasing order).
// Inlined: an out-of-line load would take the cursor, the hyperparameters
// and the scalars by address, which puts them in a stack frame.
template <class Rule>
struct RangeCursor {
  const UpdateRange* ranges;
  int64_t num_ranges;
  int64_t begin = 1;
  int64_t end = 0;
  bool skip = false;  // the range's elements are left alone (UpdateRange::skip)
  int64_t state1_shift = 0;
  typename Rule::Step c;

  __device__ __forceinline__ void seek(int64_t i, const OptimizerHyper& h, const StepScalars& s, int64_t n) {
    if (i < begin || i >= end) load(i, h, s, n);
  }

  __device__ __forceinline__ void load(int64_t i, const OptimizerHyper& h, const StepScalars& s, int64_t n) {
    if (ranges == nullptr) {
      begin = 0;
      end = n;
      skip = false;
      state1_shift = 0;
      c = math::step_constants<Rule>(h, s, 1.0f, 1.0f);
      return;
    }
    int64_t lo = 0, hi = num_ranges - 1;  // the first range with end > i
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (ranges[mid].end > i) hi = mid; else lo = mid + 1;
    }
    begin = ranges[lo].begin;
    end = ranges[lo].end;
    skip = ranges[lo].skip != 0;
    state1_shift = ranges[lo].state1_shift;
    c = math::step_constants<Rule>(h, s, ranges[lo].lr_scale, ranges[lo].weight_decay_scale);
  }
};

template <class T>
__device__ __forceinline__ T* typed(void* p) { return static_cast<T*>(p); }

// The pointers with state1 where the range keeps it (UpdateRange::state1_shift).
template <class Rule, class G, class S, class Out>
__device__ __forceinline__ math::UpdatePointers<G, S, Out> in_range(math::UpdatePointers<G, S, Out> p,
                                                                    int64_t state1_shift) {
  if constexpr (Rule::kStates >= 2) p.state1 -= state1_shift;
  return p;
}

// Pack j (elements 8j..8j+7), all in one range: 16-byte loads into
// registers, the element function on them at the constant indices 0..7 (so
// the packs never leave registers), 16-byte stores. `rng0` is element 8j's
// index in the stochastic-rounding stream.
template <class Rule, MasterMode kMode, CopyMode kCopy, class G, class S, class Out>
__device__ __forceinline__ void update_pack(const math::UpdatePointers<G, S, Out>& p, int64_t j, float gm,
                                            const typename Rule::Step& c, uint64_t seed, uint64_t step, uint64_t rng0) {
  constexpr bool kHasState0 = Rule::kStates >= 1;
  constexpr bool kHasState1 = Rule::kStates >= 2;
  constexpr bool kReadsOut = kMode != MasterMode::kFp32;
  constexpr bool kWritesOut = kMode != MasterMode::kFp32 || kCopy != CopyMode::kNone;
  const Pack<G> g = reinterpret_cast<const Pack<G>*>(p.grad)[j];
  Pack<float> w;
  Pack<int16_t> r;
  Pack<S> s0, s1;
  Pack<Out> o;
  if constexpr (kMode == MasterMode::kFp32) w = reinterpret_cast<const Pack<float>*>(p.master)[j];
  if constexpr (kMode == MasterMode::kBf16Remainder) r = reinterpret_cast<const Pack<int16_t>*>(p.remainder)[j];
  if constexpr (kHasState0) s0 = reinterpret_cast<const Pack<S>*>(p.state0)[j];
  if constexpr (kHasState1) s1 = reinterpret_cast<const Pack<S>*>(p.state1)[j];
  if constexpr (kReadsOut) o = reinterpret_cast<const Pack<Out>*>(p.out)[j];
  const math::UpdatePointers<G, S, Out> local{g.v, w.v, r.v, s0.v, s1.v, o.v};
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    math::update_element<Rule, kMode, kCopy>(local, e, gm, c, seed, step, rng0 + static_cast<uint64_t>(e));
  }
  if constexpr (kMode == MasterMode::kFp32) reinterpret_cast<Pack<float>*>(p.master)[j] = w;
  if constexpr (kMode == MasterMode::kBf16Remainder) reinterpret_cast<Pack<int16_t>*>(p.remainder)[j] = r;
  if constexpr (kHasState0) reinterpret_cast<Pack<S>*>(p.state0)[j] = s0;
  if constexpr (kHasState1) reinterpret_cast<Pack<S>*>(p.state1)[j] = s1;
  if constexpr (kWritesOut) reinterpret_cast<Pack<Out>*>(p.out)[j] = o;
}

template <class Rule, MasterMode kMode, CopyMode kCopy, class G, class S, class Out>
__global__ void update_kernel(SpanArgs a, int64_t n, OptimizerHyper h, const StepScalars* scalars,
                              const UpdateRange* ranges, int64_t num_ranges, bool vectorized) {
  const StepScalars s = *scalars;
  if (s.found_inf != 0) return;
  const float gm = s.grad_multiplier;
  const uint64_t step = static_cast<uint64_t>(s.step);
  RangeCursor<Rule> cursor{ranges, num_ranges};
  const math::UpdatePointers<G, S, Out> p{static_cast<const G*>(a.grad), a.master, a.remainder,
                                          typed<S>(a.state0), typed<S>(a.state1), typed<Out>(a.out)};
  // Element i straight in global memory, with its range's constants.
  const auto element = [&](int64_t i) {
    cursor.seek(i, h, s, n);
    if (cursor.skip) return;
    math::update_element<Rule, kMode, kCopy>(in_range<Rule>(p, cursor.state1_shift), i, gm, cursor.c, a.seed, step,
                                             a.index_offset + static_cast<uint64_t>(i));
  };
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t scalar_from = 0;
  if (vectorized) {
    const int64_t packs = n / kVec;
    for (int64_t j = first; j < packs; j += stride) {
      const int64_t i0 = j * kVec;
      cursor.seek(i0, h, s, n);
      if (i0 + kVec <= cursor.end) {  // the whole pack in one range: the common case
        if (cursor.skip) continue;
        update_pack<Rule, kMode, kCopy>(in_range<Rule>(p, cursor.state1_shift), j, gm, cursor.c, a.seed, step,
                                        a.index_offset + static_cast<uint64_t>(i0));
      } else {
        // A pack across a range boundary (at most one per boundary): element
        // by element in global memory, each with its own range's constants.
#pragma unroll 1
        for (int e = 0; e < kVec; ++e) element(i0 + e);
      }
    }
    scalar_from = packs * kVec;
  }
  for (int64_t i = scalar_from + first; i < n; i += stride) element(i);
}

using Launcher = void (*)(const SpanArgs&, int64_t, const OptimizerHyper&, const StepScalars*, const UpdateRange*,
                          int64_t, bool, cudaStream_t);

template <class Rule, MasterMode kMode, CopyMode kCopy, class G, class S, class Out>
void launch(const SpanArgs& a, int64_t n, const OptimizerHyper& h, const StepScalars* scalars,
            const UpdateRange* ranges, int64_t num_ranges, bool vectorized, cudaStream_t stream) {
  const int64_t work = vectorized ? (n + kVec - 1) / kVec : n;
  launch_kernel(&update_kernel<Rule, kMode, kCopy, G, S, Out>, cuda_launch::update(work), stream, a, n, h, scalars,
                ranges, num_ranges, vectorized);
}

struct PickLauncher {
  using Fn = Launcher;
  template <class Rule, MasterMode kMode, CopyMode kCopy, class G, class S, class Out>
  static Fn get() {
    return &launch<Rule, kMode, kCopy, G, S, Out>;
  }
};

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void fused_update_cuda(const UpdateArgs& a, const StepScalars* scalars, cudaStream_t stream) {
  const SpanVariant v = detail::plan_update(a);
  MP_ENFORCE(scalars != nullptr, "fused update on CUDA without its step scalars");
  MP_ENFORCE((a.ranges == nullptr) == (a.num_ranges == 0), "fused update: ranges and num_ranges disagree");
  if (a.n == 0) return;
  const Launcher launcher = detail::select_update_variant<PickLauncher>(v);
  MP_ENFORCE(launcher != nullptr, "fused update: no kernel for this rule and these dtypes");
  const SpanArgs sa{a.grad, a.master, a.master_remainder, a.state0, a.state1, a.param_out, a.seed, a.index_offset};
  const bool vectorized = aligned16(a.grad) && aligned16(a.master) && aligned16(a.master_remainder) &&
                          aligned16(a.state0) && aligned16(a.state1) && aligned16(a.param_out);
  launcher(sa, a.n, a.hyper, scalars, a.ranges, a.num_ranges, vectorized, stream);
}

}  // namespace mp

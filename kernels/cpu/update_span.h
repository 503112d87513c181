// kernels/cpu/update_span.h (private to kernels/cpu): the element loop of
// the fused step, compiled once per instruction set by update_<isa>.cc.
//
// Each update_<isa>.cc defines MP_UPDATE_ISA (its name) and
// MP_UPDATE_VECTORIZE, then includes this file with MP_UPDATE_SPAN_IMPL.
// Everything it instantiates is in an anonymous namespace and flattened
// into the loop functions (no out-of-line copy of a shared inline function
// compiled for a wider ISA can leak into the rest of the program), and its
// select function is only called after the CPU check in update.cc.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/update_math.h"

namespace mp {
struct UpdateArgs;  // kernels/cpu/update.h
}  // namespace mp

namespace mp::detail {

struct SpanArgs {
  const void* grad;
  float* master;
  int16_t* remainder;
  void* state0;
  void* state1;
  void* out;
  uint64_t seed;
  uint64_t index_offset;
};

struct SpanVariant {
  UpdateRule rule;
  MasterMode mode;
  math::CopyMode copy;  // kNone for kBf16Remainder and for kFp32 without a copy
  DType grad;           // fp32, bf16, fp16
  DType state;          // fp32, bf16
  DType out;            // fp32, bf16, fp16 (bf16 for kBf16Remainder); ignored without a copy
};

// Runs elements [begin, end) of range r of a step.
using SpanFn = void (*)(const SpanArgs&, int64_t begin, int64_t end, const UpdateRange& r, const OptimizerHyper& h,
                        const StepScalars& s);

// Validates the arguments (EnforceError naming what is wrong) and says which
// loop they need; shared by the CPU and CUDA steps (kernels/cpu/update.cc).
SpanVariant plan_update(const UpdateArgs& a);
// Host-side table check: sorted, contiguous, covering [0, n).
void check_ranges(const UpdateArgs& a);

SpanFn select_span_scalar(const SpanVariant& v);
SpanFn select_span_baseline(const SpanVariant& v);
SpanFn select_span_avx2(const SpanVariant& v);
SpanFn select_span_avx512(const SpanVariant& v);

// Picks the instantiation a variant needs, for the CPU loops and the CUDA
// launchers alike: Pick::Fn is the function-pointer type and
// Pick::get<Rule, kMode, kCopy, G, S, Out>() returns the instantiation;
// nullptr for combinations that do not exist. Instantiate it with a Pick
// in an anonymous namespace (everything it instantiates then stays local).
template <class Fn, class F>
Fn with_update_float_type(DType t, F&& f) {
  switch (t) {
    case DType::kF32: return f(float{});
    case DType::kBF16: return f(bf16{});
    case DType::kF16: return f(fp16{});
    default: return nullptr;
  }
}

template <class Pick, class Rule, MasterMode kMode, math::CopyMode kCopy>
typename Pick::Fn select_update_types(const SpanVariant& v) {
  using Fn = typename Pick::Fn;
  return with_update_float_type<Fn>(v.grad, [&](auto g) -> Fn {
    using G = decltype(g);
    return with_update_float_type<Fn>(v.state, [&](auto st) -> Fn {
      using S = decltype(st);
      if constexpr (std::is_same_v<S, fp16>) {
        return nullptr;  // states are fp32 or bf16
      } else if constexpr (kMode == MasterMode::kBf16Remainder) {
        return Pick::template get<Rule, kMode, kCopy, G, S, bf16>();
      } else if constexpr (kCopy == math::CopyMode::kNone) {
        return Pick::template get<Rule, kMode, kCopy, G, S, float>();
      } else {
        return with_update_float_type<Fn>(
            v.out, [](auto o) -> Fn { return Pick::template get<Rule, kMode, kCopy, G, S, decltype(o)>(); });
      }
    });
  });
}

template <class Pick, class Rule>
typename Pick::Fn select_update_mode(const SpanVariant& v) {
  using C = math::CopyMode;
  using M = MasterMode;
  switch (v.mode) {
    case M::kBf16Remainder: return select_update_types<Pick, Rule, M::kBf16Remainder, C::kNone>(v);
    case M::kFp32:
      if (v.copy == C::kNone) return select_update_types<Pick, Rule, M::kFp32, C::kNone>(v);
      if (v.copy == C::kNearest) return select_update_types<Pick, Rule, M::kFp32, C::kNearest>(v);
      return select_update_types<Pick, Rule, M::kFp32, C::kStochastic>(v);
    case M::kNone:
      if (v.copy == C::kNearest) return select_update_types<Pick, Rule, M::kNone, C::kNearest>(v);
      if (v.copy == C::kStochastic) return select_update_types<Pick, Rule, M::kNone, C::kStochastic>(v);
      return nullptr;
  }
  return nullptr;
}

template <class Pick>
typename Pick::Fn select_update_variant(const SpanVariant& v) {
  return math::with_rule<typename Pick::Fn>(v.rule, nullptr,
                                            [&](auto rule) { return select_update_mode<Pick, decltype(rule)>(v); });
}

}  // namespace mp::detail

#if defined(MP_UPDATE_SPAN_IMPL)

#define MP_UPDATE_CAT2(a, b) a##b
#define MP_UPDATE_CAT(a, b) MP_UPDATE_CAT2(a, b)

namespace mp::detail {
namespace {

using math::CopyMode;

template <class Rule, MasterMode kMode, CopyMode kCopy, class G, class S, class Out>
[[gnu::flatten]] void span(const SpanArgs& a, int64_t begin, int64_t end, const UpdateRange& r, const OptimizerHyper& h,
                           const StepScalars& s) {
  math::UpdatePointers<G, S, Out> p{static_cast<const G*>(a.grad), a.master, a.remainder,
                                    static_cast<S*>(a.state0), static_cast<S*>(a.state1), static_cast<Out*>(a.out)};
  if constexpr (Rule::kStates >= 2) p.state1 -= r.state1_shift;  // where the range keeps it
  const typename Rule::Step c = math::step_constants<Rule>(h, s, r.lr_scale, r.weight_decay_scale);
  const float gm = s.grad_multiplier;
  const uint64_t seed = a.seed, step = static_cast<uint64_t>(s.step), offset = a.index_offset;
  // Elements are independent: no loop-carried dependence, no aliasing
  // between the arrays (checked by fused_update_cpu).
#if MP_UPDATE_VECTORIZE
#pragma omp simd
#endif
  for (int64_t i = begin; i < end; ++i) {
    math::update_element<Rule, kMode, kCopy>(p, i, gm, c, seed, step, offset + static_cast<uint64_t>(i));
  }
}

struct PickSpan {
  using Fn = SpanFn;
  template <class Rule, MasterMode kMode, CopyMode kCopy, class G, class S, class Out>
  static Fn get() {
    return &span<Rule, kMode, kCopy, G, S, Out>;
  }
};

}  // namespace

SpanFn MP_UPDATE_CAT(select_span_, MP_UPDATE_ISA)(const SpanVariant& v) { return select_update_variant<PickSpan>(v); }

}  // namespace mp::detail

#endif  // MP_UPDATE_SPAN_IMPL

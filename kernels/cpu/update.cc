#include "kernels/cpu/update.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/update_span.h"

namespace mp {
namespace {

using detail::SpanFn;

// Below this many elements per thread, waking another thread costs more
// than it saves.
constexpr int64_t kMinPerThread = int64_t{1} << 16;

SpanFn select(CpuIsa isa, const detail::SpanVariant& v) {
  switch (isa) {
    case CpuIsa::kScalar: return detail::select_span_scalar(v);
#if MP_CPU_HAVE_X86
    case CpuIsa::kAvx2: return detail::select_span_avx2(v);
    case CpuIsa::kAvx512: return detail::select_span_avx512(v);
#endif
    default: return detail::select_span_baseline(v);
  }
}

// The arrays a step touches, with their byte extents, for the overlap check.
struct Extent {
  const char* name;
  const void* p;
  int64_t bytes;
};

int64_t state1_numel(const UpdateArgs& a) { return a.state1_numel < 0 ? a.n : a.state1_numel; }

// Where the ranges keep their second moments: each updated range's
// [begin, end) - state1_shift inside state1, after the one before it.
void check_state1_shifts(const UpdateArgs& a) {
  const int64_t numel = state1_numel(a);
  MP_ENFORCE(numel >= 0 && numel <= a.n, "fused update: state1 has ", numel, " elements for a shard of ", a.n);
  int64_t used = 0, shift = 0;
  for (int64_t k = 0; a.ranges != nullptr && k < a.num_ranges; ++k) {
    const UpdateRange& r = a.ranges[k];
    MP_ENFORCE(r.state1_shift % 64 == 0 && r.state1_shift >= shift && r.state1_shift <= r.begin, "fused update: range ",
               k, " has state1_shift ", r.state1_shift, " (a multiple of 64, non-decreasing, at most its begin ",
               r.begin, ")");
    shift = r.state1_shift;
    if (r.skip != 0) continue;
    MP_ENFORCE(r.begin - shift >= used && r.end - shift <= numel, "fused update: range ", k, " keeps its state1 at [",
               r.begin - shift, ", ", r.end - shift, "), overlapping the range before it or past state1's ", numel,
               " elements");
    used = r.end - shift;
  }
}

void check_disjoint(const std::vector<Extent>& xs) {
  for (size_t i = 0; i < xs.size(); ++i) {
    for (size_t j = i + 1; j < xs.size(); ++j) {
      const auto a = reinterpret_cast<uintptr_t>(xs[i].p), b = reinterpret_cast<uintptr_t>(xs[j].p);
      const bool overlap = a < b + static_cast<uintptr_t>(xs[j].bytes) && b < a + static_cast<uintptr_t>(xs[i].bytes);
      MP_ENFORCE(!overlap, "fused update: ", xs[i].name, " and ", xs[j].name, " overlap");
    }
  }
}

}  // namespace

namespace detail {

void check_ranges(const UpdateArgs& a) {
  if (a.ranges == nullptr) {
    MP_ENFORCE(a.num_ranges == 0, "fused update: num_ranges is ", a.num_ranges, " but ranges is null");
    MP_ENFORCE(state1_numel(a) == a.n, "fused update: state1 has ", state1_numel(a), " elements for a shard of ", a.n,
               " updated whole");
    return;
  }
  MP_ENFORCE(a.num_ranges > 0, "fused update: an empty range table");
  int64_t expect = 0;
  for (int64_t k = 0; k < a.num_ranges; ++k) {
    const UpdateRange& r = a.ranges[k];
    MP_ENFORCE(r.begin == expect && r.end > r.begin, "fused update: range ", k, " is [", r.begin, ", ", r.end,
               "); ranges must be non-empty, sorted and contiguous (expected it to begin at ", expect, ")");
    MP_ENFORCE(std::isfinite(r.lr_scale) && std::isfinite(r.weight_decay_scale), "fused update: range ", k,
               " has a non-finite scale");
    expect = r.end;
  }
  MP_ENFORCE(expect == a.n, "fused update: the ranges cover [0, ", expect, ") but the shard has ", a.n, " elements");
  check_state1_shifts(a);
}

}  // namespace detail

int64_t update_bytes_per_param(const UpdateArgs& a) {
  const int64_t g = dtype_size(a.grad_dtype), s = dtype_size(a.state_dtype), o = dtype_size(a.param_dtype);
  int64_t master = 0;
  switch (a.master_mode) {
    case MasterMode::kFp32: master = 8 + (a.param_out ? o : 0); break;
    case MasterMode::kBf16Remainder: master = 8; break;  // bf16 half and remainder, read and written
    case MasterMode::kNone: master = 2 * o; break;
  }
  return g + master + 2 * s * math::rule_states(a.hyper.rule);
}

namespace detail {

SpanVariant plan_update(const UpdateArgs& a) {
  MP_ENFORCE(a.n >= 0, "fused update of ", a.n, " elements");
  const int states = math::rule_states(a.hyper.rule);
  const bool remainder = a.master_mode == MasterMode::kBf16Remainder;
  const bool none = a.master_mode == MasterMode::kNone;
  MP_ENFORCE(a.n == 0 || a.grad != nullptr, "fused update without a gradient");
  MP_ENFORCE(a.n == 0 || (remainder ? a.param_out != nullptr && a.master_remainder != nullptr
                          : none    ? a.param_out != nullptr
                                    : a.master != nullptr),
             "fused update without its master arrays (mode ", static_cast<int>(a.master_mode), ")");
  MP_ENFORCE(!remainder || a.param_dtype == DType::kBF16, "bf16_remainder keeps a bf16 parameter copy, not ",
             dtype_name(a.param_dtype));
  MP_ENFORCE(a.state_dtype == DType::kF32 || a.state_dtype == DType::kBF16,
             "optimizer state must be fp32 or bf16, not ", dtype_name(a.state_dtype));
  MP_ENFORCE(!is_fp8(a.grad_dtype) && !is_fp8(a.param_dtype), "fused update with fp8 gradients or parameters");
  MP_ENFORCE(a.n == 0 || states < 1 || a.state0 != nullptr, "fused update: its rule keeps ", states,
             " state arrays; state0 is missing");
  MP_ENFORCE(state1_numel(a) == 0 || states < 2 || a.state1 != nullptr,
             "fused update: its rule keeps 2 state arrays; state1 is missing");

  const int64_t gs = dtype_size(a.grad_dtype), ss = dtype_size(a.state_dtype), os = dtype_size(a.param_dtype);
  std::vector<Extent> extents{{"grad", a.grad, a.n * gs}};
  if (a.master_mode == MasterMode::kFp32) extents.push_back({"master", a.master, a.n * 4});
  if (remainder) extents.push_back({"master_remainder", a.master_remainder, a.n * 2});
  if (a.param_out != nullptr) extents.push_back({"param_out", a.param_out, a.n * os});
  if (states >= 1) extents.push_back({"state0", a.state0, a.n * ss});
  if (states >= 2) extents.push_back({"state1", a.state1, state1_numel(a) * ss});
  if (a.n > 0) check_disjoint(extents);

  SpanVariant v;
  v.rule = a.hyper.rule;
  v.mode = a.master_mode;
  v.grad = a.grad_dtype;
  v.state = states >= 1 ? a.state_dtype : DType::kF32;
  v.out = a.param_dtype;
  const bool stochastic = a.rounding == Rounding::kStochastic && a.param_dtype != DType::kF32;
  v.copy = remainder || a.param_out == nullptr ? math::CopyMode::kNone
           : stochastic                        ? math::CopyMode::kStochastic
                                               : math::CopyMode::kNearest;
  return v;
}

}  // namespace detail

void fused_update_cpu(const UpdateArgs& a, const StepScalars& scalars) {
  detail::check_ranges(a);
  const detail::SpanVariant v = detail::plan_update(a);
  if (scalars.found_inf != 0 || a.n == 0) return;
  MP_ENFORCE(scalars.step >= 1, "fused update at step ", scalars.step, " (steps count from 1)");
  CpuIsa isa = a.isa == CpuIsa::kAuto ? cpu_isa_best() : a.isa;
  MP_ENFORCE(cpu_isa_available(isa), "fused update: this CPU or build has no ", cpu_isa_name(isa), " variant");
  const SpanFn fn = select(isa, v);
  MP_ENFORCE(fn != nullptr, "fused update: no kernel for this rule and these dtypes");

  const detail::SpanArgs sa{a.grad, a.master, a.master_remainder, a.state0, a.state1, a.param_out, a.seed,
                            a.index_offset};
  const UpdateRange whole{0, a.n, 1.0f, 1.0f};
  const UpdateRange* ranges = a.ranges ? a.ranges : &whole;
  const int64_t num_ranges = a.ranges ? a.num_ranges : 1;
  int threads = a.threads > 0 ? a.threads : default_cpu_threads();
  threads = static_cast<int>(std::min<int64_t>(threads, (a.n + kMinPerThread - 1) / kMinPerThread));
  // Parts start on 64-element boundaries (whole cache lines of every array).
  parallel_for(a.n, threads, 64, [&](int64_t begin, int64_t end) {
    int64_t k = std::upper_bound(ranges, ranges + num_ranges, begin,
                                 [](int64_t i, const UpdateRange& r) { return i < r.end; }) -
                ranges;
    for (; k < num_ranges && ranges[k].begin < end; ++k) {
      if (ranges[k].skip == 0) {
        fn(sa, std::max(begin, ranges[k].begin), std::min(end, ranges[k].end), ranges[k], a.hyper, scalars);
      }
    }
  });
}

}  // namespace mp

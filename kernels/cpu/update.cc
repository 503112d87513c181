#include "kernels/cpu/update.h"

#include "kernels/convert_math.h"
#include "kernels/philox_math.h"
#include "kernels/remainder_math.h"
#include "runtime/error.h"

namespace mp {
namespace {

template <class S>
float load_state(const void* p, int64_t i) {
  return p ? math::to_f32(static_cast<const S*>(p)[i]) : 0.0f;
}

template <class S>
void store_state(void* p, int64_t i, float v) {
  if (p) static_cast<S*>(p)[i] = math::from_f32<S>(v);
}

template <class G, class S, class Out, bool kStochastic, MasterMode kMode>
void update_loop(const UpdateArgs& a) {
  const G* grad = static_cast<const G*>(a.grad);
  Out* out = static_cast<Out*>(a.param_out);
  for (int64_t i = 0; i < a.n; ++i) {
    const float g = math::to_f32(grad[i]) * a.grad_multiplier;
    float p;
    if constexpr (kMode == MasterMode::kFp32) {
      p = a.master[i];
    } else if constexpr (kMode == MasterMode::kBf16Remainder) {
      p = math::merge_bf16_remainder(a.master_bf16[i], a.master_remainder[i]);
    } else {
      p = math::to_f32(out[i]);
    }
    float s0 = load_state<S>(a.state0, i);
    float s1 = load_state<S>(a.state1, i);
    switch (a.kind) {
      case OptimizerKind::kAdamW: math::adamw_element(p, s0, s1, g, a.adamw); break;
      case OptimizerKind::kSgd: math::sgd_element(p, s0, g, a.sgd); break;
      case OptimizerKind::kLion: math::lion_element(p, s0, g, a.lion); break;
    }
    if constexpr (kMode == MasterMode::kBf16Remainder) {
      const math::Bf16Remainder split = math::split_bf16_remainder(p);
      a.master_bf16[i] = split.h;
      a.master_remainder[i] = split.r;
    } else if constexpr (kMode == MasterMode::kFp32) {
      a.master[i] = p;
    }
    store_state<S>(a.state0, i, s0);
    store_state<S>(a.state1, i, s1);
    if (kMode != MasterMode::kBf16Remainder && out != nullptr) {
      if constexpr (kStochastic) {
        out[i] = math::from_f32_stochastic<Out>(p, math::philox_u32(a.seed, a.step, a.index_offset + static_cast<uint64_t>(i)));
      } else {
        out[i] = math::from_f32<Out>(p);
      }
    }
  }
}

}  // namespace

void fused_update_cpu(const UpdateArgs& a, bool found_inf) {
  if (found_inf || a.n == 0) return;
  const bool remainder = a.master_mode == MasterMode::kBf16Remainder;
  MP_ENFORCE(a.grad != nullptr, "fused update without a gradient");
  const bool none = a.master_mode == MasterMode::kNone;
  MP_ENFORCE(remainder ? a.master_bf16 != nullptr && a.master_remainder != nullptr
             : none    ? a.param_out != nullptr
                       : a.master != nullptr,
             "fused update without its master arrays");
  MP_ENFORCE(!remainder || a.param_out == nullptr,
             "bf16_remainder: the bf16 half of the master is the parameter copy; param_out must be null");
  MP_ENFORCE(a.state_dtype == DType::kF32 || a.state_dtype == DType::kBF16, "optimizer state must be fp32 or bf16, not ",
             dtype_name(a.state_dtype));
  MP_ENFORCE(!is_fp8(a.grad_dtype) && !is_fp8(a.param_dtype), "fused update with fp8 gradients or parameters");
  MP_ENFORCE(a.kind == OptimizerKind::kSgd || a.state0 != nullptr, "optimizer state missing");
  MP_ENFORCE(a.kind != OptimizerKind::kAdamW || a.state1 != nullptr, "AdamW needs two moments");
  MP_ENFORCE(a.kind != OptimizerKind::kSgd || a.sgd.momentum == 0.0f || a.state0 != nullptr,
             "SGD with momentum needs a momentum buffer");
  const bool stochastic = a.rounding == Rounding::kStochastic;
  dispatch_dtype(a.grad_dtype, [&](auto g) {
    dispatch_dtype(a.param_dtype, [&](auto o) {
      using G = decltype(g);
      using Out = decltype(o);
      if constexpr (!math::kHasStochasticRounding<Out> || std::is_same_v<G, fp8_e4m3> ||
                    std::is_same_v<G, fp8_e5m2>) {
        MP_THROW(EnforceError, "unreachable: dtypes checked above");
      } else {
        auto run = [&](auto s) {
          using S = decltype(s);
          if (remainder) return update_loop<G, S, Out, false, MasterMode::kBf16Remainder>(a);
          if (none && stochastic) return update_loop<G, S, Out, true, MasterMode::kNone>(a);
          if (none) return update_loop<G, S, Out, false, MasterMode::kNone>(a);
          if (stochastic) return update_loop<G, S, Out, true, MasterMode::kFp32>(a);
          update_loop<G, S, Out, false, MasterMode::kFp32>(a);
        };
        if (a.state_dtype == DType::kF32) {
          run(float{});
        } else {
          run(bf16{});
        }
      }
    });
  });
}

}  // namespace mp

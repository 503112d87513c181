// The fused step's CPU variants: every loop variant on every ISA this CPU
// has equals the scalar build bit for bit (NaN payloads aside), and the
// result does not depend on the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/convert_math.h"
#include "kernels/cpu/update.h"
#include "tests/update_test_util.h"

namespace mp {
namespace {

using testing::Array;
using testing::all_rules;
using testing::hyper_for;

// Inputs that exercise every path: normal values, NaN and Inf gradients and
// masters, denormals, huge values, exact bf16 ties.
std::vector<float> nasty(int64_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    switch (i % 97) {
      case 3: v[i] = std::numeric_limits<float>::quiet_NaN(); break;
      case 5: v[i] = -std::numeric_limits<float>::infinity(); break;
      case 7: v[i] = 1e-40f; break;
      case 11: v[i] = 3e38f; break;
      case 13: v[i] = math::f32_from_bits(0x3f808000u); break;  // a bf16 tie
      case 17: v[i] = math::f32_from_bits(0x7fffffffu); break;  // NaN with a full payload
      default: v[i] = normal(rng);
    }
  }
  return v;
}

struct VariantState {
  std::vector<float> master;
  std::vector<int16_t> remainder;
  Array s0, s1, out, grad;
};

VariantState make_variant_state(int64_t n, MasterMode mode, DType grad, DType state, DType param) {
  VariantState v;
  const auto p = nasty(n, 1, 0.1f), g = nasty(n, 2, 1.0f), m = nasty(n, 3, 0.01f);
  v.grad = Array(grad, n);
  v.s0 = Array(state, n);
  v.s1 = Array(state, n);
  v.out = Array(param, n);
  if (mode == MasterMode::kFp32) v.master = p;
  if (mode == MasterMode::kBf16Remainder) v.remainder.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    v.grad.set(i, g[i]);
    v.s0.set(i, m[i]);
    v.s1.set(i, std::fabs(m[i]));
    if (mode == MasterMode::kBf16Remainder) {
      const auto split = math::split_bf16_remainder(p[i]);
      std::memcpy(v.out.bytes.data() + 2 * i, &split.h, 2);
      v.remainder[i] = split.r;
    } else {
      v.out.set(i, p[i]);
    }
  }
  return v;
}

UpdateArgs variant_args(VariantState& v, const OptimizerHyper& h, MasterMode mode, bool copy, Rounding rounding) {
  UpdateArgs a;
  a.hyper = h;
  a.n = static_cast<int64_t>(v.out.bytes.size()) / dtype_size(v.out.dtype);
  a.master_mode = mode;
  a.master = v.master.empty() ? nullptr : v.master.data();
  a.master_remainder = v.remainder.empty() ? nullptr : v.remainder.data();
  a.state0 = v.s0.data();
  a.state1 = v.s1.data();
  a.state_dtype = v.s0.dtype;
  a.grad = v.grad.data();
  a.grad_dtype = v.grad.dtype;
  a.param_out = copy ? v.out.data() : nullptr;
  a.param_dtype = v.out.dtype;
  a.rounding = rounding;
  a.seed = 5;
  a.index_offset = 1000;
  return a;
}

// Bitwise equal, except that any two NaNs are equal: which NaN an
// operation with NaN operands returns depends on operand order, which the
// vectorizer may swap (x86 returns the first operand's payload).
bool same_value(float x, float y) {
  return math::f32_bits(x) == math::f32_bits(y) || (std::isnan(x) && std::isnan(y));
}

// Reports the first difference.
bool same_bits(const VariantState& a, const VariantState& b) {
  auto same = [](const Array& x, const Array& y, const char* what) {
    const int64_t n = static_cast<int64_t>(x.bytes.size()) / dtype_size(x.dtype);
    for (int64_t i = 0; i < n; ++i) {
      if (!same_value(x.get(i), y.get(i))) {
        ADD_FAILURE() << what << " differs first at element " << i << ": " << x.get(i) << " vs " << y.get(i);
        return false;
      }
    }
    return true;
  };
  for (size_t i = 0; i < a.master.size(); ++i) {
    if (!same_value(a.master[i], b.master[i])) {
      ADD_FAILURE() << "master differs first at element " << i;
      return false;
    }
  }
  for (size_t i = 0; i < a.remainder.size(); ++i) {
    uint16_t ha, hb;
    std::memcpy(&ha, a.out.bytes.data() + 2 * i, 2);
    std::memcpy(&hb, b.out.bytes.data() + 2 * i, 2);
    if (!same_value(math::merge_bf16_remainder(ha, a.remainder[i]), math::merge_bf16_remainder(hb, b.remainder[i]))) {
      ADD_FAILURE() << "bf16_remainder master differs first at element " << i;
      return false;
    }
  }
  return same(a.s0, b.s0, "state0") && same(a.s1, b.s1, "state1") && same(a.out, b.out, "out");
}

// Every loop variant (optimizer x master mode x copy x grad, state and
// param dtypes x rounding) on every ISA this CPU has, against the scalar
// build of the same loop, on a shard with a range table and odd sizes.
TEST(FusedUpdate, CpuVectorPathsEqualTheScalarPathBitForBit) {
  const int64_t n = 1000 + 37;
  const std::vector<UpdateRange> table{{0, 500, 1.0f, 1.0f}, {500, 503, 0.5f, 0.0f}, {503, n, 1.5f, 1.0f}};
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (cpu_isa_available(isa)) isas.push_back(isa);
  }
  ASSERT_FALSE(isas.empty());
  int variants = 0;
  for (const UpdateRule rule : all_rules()) {
    const OptimizerHyper h = hyper_for(rule);
    for (MasterMode mode : {MasterMode::kFp32, MasterMode::kBf16Remainder, MasterMode::kNone}) {
      for (bool copy : {true, false}) {
        if (!copy && mode != MasterMode::kFp32) continue;
        for (DType grad : {DType::kF32, DType::kBF16, DType::kF16}) {
          for (DType state : {DType::kF32, DType::kBF16}) {
            for (DType param : {DType::kF32, DType::kBF16, DType::kF16}) {
              if (mode == MasterMode::kBf16Remainder && param != DType::kBF16) continue;
              for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
                StepScalars sc;
                sc.lr = 1e-2f;
                sc.grad_multiplier = 0.3f;
                sc.step = 3;
                VariantState want = make_variant_state(n, mode, grad, state, param);
                UpdateArgs a = variant_args(want, h, mode, copy, rounding);
                a.ranges = table.data();
                a.num_ranges = static_cast<int64_t>(table.size());
                a.isa = CpuIsa::kScalar;
                a.threads = 1;
                fused_update_cpu(a, sc);
                for (CpuIsa isa : isas) {
                  VariantState got = make_variant_state(n, mode, grad, state, param);
                  UpdateArgs b = variant_args(got, h, mode, copy, rounding);
                  b.ranges = a.ranges;
                  b.num_ranges = a.num_ranges;
                  b.isa = isa;
                  fused_update_cpu(b, sc);
                  ASSERT_TRUE(same_bits(want, got))
                      << cpu_isa_name(isa) << ": optimizer " << static_cast<int>(h.rule) << " momentum "
                      << h.momentum << " mode " << static_cast<int>(mode) << " copy " << copy << " grad "
                      << dtype_name(grad) << " state " << dtype_name(state) << " param " << dtype_name(param)
                      << " rounding " << static_cast<int>(rounding);
                }
                ++variants;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(variants, 300);
}

// Threads split the shard; the result (stochastic rounding included: each
// element draws from its global index) does not depend on how.
TEST(FusedUpdate, ResultDoesNotDependOnTheThreadCount) {
  const int64_t n = (int64_t{1} << 18) + 5;  // several parts of 64K elements
  const std::vector<UpdateRange> table{{0, 100000, 1.0f, 1.0f}, {100000, 100003, 0.5f, 0.0f}, {100003, n, 2.0f, 1.0f}};
  VariantState one = make_variant_state(n, MasterMode::kFp32, DType::kBF16, DType::kF32, DType::kBF16);
  VariantState many = make_variant_state(n, MasterMode::kFp32, DType::kBF16, DType::kF32, DType::kBF16);
  StepScalars sc;
  sc.step = 2;
  for (int threads : {1, 3}) {
    VariantState& v = threads == 1 ? one : many;
    UpdateArgs a = variant_args(v, hyper_for(UpdateRule::kAdamW), MasterMode::kFp32, true, Rounding::kStochastic);
    a.ranges = table.data();
    a.num_ranges = static_cast<int64_t>(table.size());
    a.threads = threads;
    fused_update_cpu(a, sc);
  }
  EXPECT_TRUE(same_bits(one, many));
}

}  // namespace
}  // namespace mp

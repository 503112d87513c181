// kernels/cpu/cpu_isa.h: the instruction-set variants the CPU element loops
// are compiled in (the fused update, kernels/cpu/update_<isa>.cc, and the
// GPT layer loops, kernels/cpu/layer_loops_<isa>.cc), and which one this CPU
// runs. Every variant of a loop computes the same bits (no FMA contraction,
// correctly rounded division and sqrt, integer conversions); only its speed
// depends on the variant.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

namespace mp {

// kScalar (the vectorizer off) exists for the update only: its reference.
enum class CpuIsa : uint8_t { kAuto = 0, kScalar, kBaseline, kAvx2, kAvx512 };

std::string_view cpu_isa_name(CpuIsa isa);
// Whether this build has the variant and this CPU can run it.
bool cpu_isa_available(CpuIsa isa);
// What kAuto resolves to here: the widest available.
CpuIsa cpu_isa_best();

// Files that compile their loops once per ISA with target attributes
// (grad_stats.cc, reduce.cc, convert.cc) keep a table of function pointers
// per variant, name_baseline, name_avx2 and name_avx512 (the last two on x86
// only), and pick one with MP_ISA_TABLE(name): the widest this CPU runs.
template <class Table>
const Table& isa_table(const Table& baseline, const Table* avx2, const Table* avx512) {
  const CpuIsa best = cpu_isa_best();
  if (best == CpuIsa::kAvx512 && avx512 != nullptr) return *avx512;
  if ((best == CpuIsa::kAvx512 || best == CpuIsa::kAvx2) && avx2 != nullptr) return *avx2;
  return baseline;
}

}  // namespace mp

// MP_ISA_VARIANTS(M) expands M(isa, attributes) once per variant such a
// file compiles: baseline, and on x86 avx2 and avx512 (the features
// cpu_isa_best() requires for them).
#if defined(MP_CPU_HAVE_X86) && MP_CPU_HAVE_X86
#define MP_ISA_VARIANTS(M)                                  \
  M(baseline, __attribute__((flatten)))                     \
  M(avx2, __attribute__((target("avx2"), flatten)))         \
  M(avx512, __attribute__((target("avx512f,avx512bw,avx512vl"), flatten)))
#define MP_ISA_TABLE(name) ::mp::isa_table(name##_baseline, &name##_avx2, &name##_avx512)
#else
#define MP_ISA_VARIANTS(M) M(baseline, __attribute__((flatten)))
#define MP_ISA_TABLE(name) \
  ::mp::isa_table<std::remove_cvref_t<decltype(name##_baseline)>>(name##_baseline, nullptr, nullptr)
#endif

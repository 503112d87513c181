#include "kernels/cpu/cpu_isa.h"

namespace mp {

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kBaseline: return "baseline";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "?";
}

bool cpu_isa_available(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kScalar:
    case CpuIsa::kBaseline: return true;
#if MP_CPU_HAVE_X86
    case CpuIsa::kAvx2: return __builtin_cpu_supports("avx2");
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
#else
    case CpuIsa::kAvx2:
    case CpuIsa::kAvx512: return false;
#endif
  }
  return false;
}

CpuIsa cpu_isa_best() {
  static const CpuIsa best = [] {
    if (cpu_isa_available(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
    if (cpu_isa_available(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
    return CpuIsa::kBaseline;
  }();
  return best;
}

}  // namespace mp

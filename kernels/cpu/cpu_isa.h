// kernels/cpu/cpu_isa.h: the instruction-set variants the CPU element loops
// are compiled in (the fused update, kernels/cpu/update_<isa>.cc, and the
// GPT layer loops, kernels/cpu/gpt_loops_<isa>.cc), and which one this CPU
// runs. Every variant of a loop computes the same bits (no FMA contraction,
// correctly rounded division and sqrt, integer conversions); only its speed
// depends on the variant.
#pragma once

#include <cstdint>
#include <string_view>

namespace mp {

// kScalar (the vectorizer off) exists for the update only: its reference.
enum class CpuIsa : uint8_t { kAuto = 0, kScalar, kBaseline, kAvx2, kAvx512 };

std::string_view cpu_isa_name(CpuIsa isa);
// Whether this build has the variant and this CPU can run it.
bool cpu_isa_available(CpuIsa isa);
// What kAuto resolves to here: the widest available.
CpuIsa cpu_isa_best();

}  // namespace mp

#include "kernels/cpu/layer_loops.h"

#include <vector>

#include "core/error.h"

namespace mp {

float* thread_floats(ThreadFloats use, int64_t n) {
  thread_local std::vector<float> buffers[static_cast<size_t>(ThreadFloats::kCount)];
  std::vector<float>& buffer = buffers[static_cast<size_t>(use)];
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

const LayerLoops& layer_loops(CpuIsa isa) {
  if (isa == CpuIsa::kAuto) {
    static const LayerLoops& best = layer_loops(cpu_isa_best());
    return best;
  }
  MP_ENFORCE(isa != CpuIsa::kScalar && cpu_isa_available(isa), "GPT loops: this CPU or build has no ",
             cpu_isa_name(isa), " variant");
  switch (isa) {
#if MP_CPU_HAVE_X86
    case CpuIsa::kAvx2: return detail::select_layer_loops_avx2();
    case CpuIsa::kAvx512: return detail::select_layer_loops_avx512();
#endif
    default: return detail::select_layer_loops_baseline();
  }
}

}  // namespace mp

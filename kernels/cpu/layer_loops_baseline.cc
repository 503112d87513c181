// The GPT layer loops for the baseline variant (flags in kernels/CMakeLists.txt).
#define MP_GPT_LOOPS_ISA baseline
#define MP_LOOPS_PRIVATE  // kernels/cpu/loops.h's helpers local to this object
#include "kernels/cpu/layer_loops_impl.h"

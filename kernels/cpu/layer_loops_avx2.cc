// The GPT layer loops for the avx2 variant (flags in kernels/CMakeLists.txt).
#define MP_GPT_LOOPS_ISA avx2
#define MP_LOOPS_PRIVATE  // kernels/cpu/loops.h's helpers local to this object
#include "kernels/cpu/layer_loops_impl.h"

// The GPT layer loops for the avx2 variant (flags in kernels/CMakeLists.txt).
#define MP_GPT_LOOPS_ISA avx2
#include "kernels/cpu/gpt_loops_impl.h"

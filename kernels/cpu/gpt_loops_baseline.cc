// The GPT layer loops for the baseline variant (flags in kernels/CMakeLists.txt).
#define MP_GPT_LOOPS_ISA baseline
#include "kernels/cpu/gpt_loops_impl.h"

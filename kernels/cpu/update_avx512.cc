// The fused-step loop for the avx512 variant (flags in kernels/CMakeLists.txt).
#define MP_UPDATE_ISA avx512
#define MP_UPDATE_VECTORIZE 1
#define MP_UPDATE_SPAN_IMPL
#include "kernels/cpu/update_span.h"

// The fused-step loop for the baseline variant (flags in kernels/CMakeLists.txt).
#define MP_UPDATE_ISA baseline
#define MP_UPDATE_VECTORIZE 1
#define MP_UPDATE_SPAN_IMPL
#include "kernels/cpu/update_span.h"

// The fused-step loop for the scalar variant (flags in kernels/CMakeLists.txt).
#define MP_UPDATE_ISA scalar
#define MP_UPDATE_VECTORIZE 0
#define MP_UPDATE_SPAN_IMPL
#include "kernels/cpu/update_span.h"

// kernels/hd.h: MP_HD marks a function that runs on the host and on CUDA
// devices. Per-element math is written once as MP_HD functions; the CPU loops
// (kernels/cpu) and the CUDA kernels (kernels/cuda) both call them.
#pragma once

//
// Always inlined, on the host too (as __forceinline__ does in CUDA files):
// the per-ISA update objects (kernels/cpu/update_<isa>.cc) must not emit an
// out-of-line copy of one, compiled with AVX, that the linker could pick for
// every caller. At -O2 and above GCC inlines them anyway; clang at -O1 (the
// sanitizer build) did not (test kernels_isa_objects_export_only_select).
#if defined(__CUDACC__)
#define MP_HD __host__ __device__ __forceinline__
#else
#define MP_HD inline __attribute__((always_inline))
#endif

// kernels/hd.h: MP_HD marks a function that runs on the host and on CUDA
// devices. Per-element math is written once as MP_HD functions; the CPU loops
// (kernels/cpu) and the CUDA kernels (kernels/cuda) both call them.
#pragma once

#if defined(__CUDACC__)
#define MP_HD __host__ __device__ __forceinline__
#else
#define MP_HD inline
#endif

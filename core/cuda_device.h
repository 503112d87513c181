// core/cuda_device.h: the CUDA runtime calls behind core/device.h,
// core/allocator.h and core/tensor.h, kept in one translation unit
// (core/cuda_device.cc) so that no other core file includes CUDA headers.
// Declarations only; callers guard their use with MP_WITH_CUDA.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "core/device.h"

namespace mp::detail {

CudaInfo cuda_probe();                 // never throws
void cuda_set_device(int index);
// cudaDeviceSynchronize on device `index`, errors ignored (teardown),
// bounded as core/device.h wait_for_device_idle says.
void cuda_wait_idle(int index, std::chrono::milliseconds timeout) noexcept;
std::string cuda_describe(int index);
void* cuda_malloc(int index, size_t size_bytes);  // nullptr on out-of-memory
void cuda_free(int index, void* ptr) noexcept;
// Copies bytes between any two of host/device memory. With a non-null
// cudaStream_t (passed as void*) the copy is asynchronous on that stream.
void cuda_memcpy(void* dst, const void* src, size_t size_bytes, void* stream);
void cuda_memset_zero(void* dst, size_t size_bytes, void* stream);

}  // namespace mp::detail

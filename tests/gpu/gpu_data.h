// tests/gpu/gpu_data.h: device buffers and comparisons shared by the GPU
// op tests (test_gpu_gpt_ops.cc, test_gpu_gemm.cc).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/error_cuda.h"
#include "tests/gpu/gpu_test.h"
#include "tests/test_util.h"

namespace mp::testing {

// Device copy of a host vector (at least one element, so never null),
// uploaded on the test's stream; host() downloads it on that stream, after
// the work enqueued there before (copy_on_stream).
template <class T>
class DeviceVector {
 public:
  DeviceVector(const std::vector<T>& host, cudaStream_t stream) : n_(host.size()), stream_(stream) {
    MP_CHECK_CUDA(cudaMalloc(&p_, std::max<size_t>(n_, 1) * sizeof(T)));
    copy_on_stream(p_, host.data(), n_ * sizeof(T), stream_);
  }
  DeviceVector(size_t n, cudaStream_t stream) : DeviceVector(std::vector<T>(n), stream) {}
  ~DeviceVector() { cudaFree(p_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  T* get() const { return static_cast<T*>(p_); }
  std::vector<T> host() const {
    std::vector<T> out(n_);
    copy_on_stream(out.data(), p_, n_ * sizeof(T), stream_);
    return out;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
  cudaStream_t stream_;
};

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}


// |got - want| <= atol + rtol |want| everywhere; names the first few misses.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rtol, double atol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i])) && ++misses <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (error " << err << ")";
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " elements outside tolerance";
}

inline void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i] << " (not bitwise equal)";
      return;
    }
  }
}

}  // namespace mp::testing

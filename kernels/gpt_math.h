// kernels/gpt_math.h: the per-element math of the GPT-2 layer ops, written
// once as MP_HD functions. The CPU ops (kernels/cpu/, Note [Layer ops on the CPU]) and the CUDA
// kernels (kernels/cuda/gpt_ops_cuda.cu) both call these, so the CPU tests
// against float64 prove the formulas the GPU runs; only the order of the
// row reductions differs between the two.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#if !defined(__CUDA_ARCH__)
#include <bit>
#endif

#include "kernels/hd.h"

namespace mp::math {

inline constexpr double kGptLayerNormEps = 1e-5;
inline constexpr double kGeluSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
inline constexpr double kGeluCubic = 0.044715;

// floor(x) for |x| < 2^31, written the way each target vectorizes: the
// SSE4.1 and wider loops (and CUDA) have a rounding instruction; baseline
// x86-64 (SSE2) vectorizes the truncation and adjustment. Both are exact.
MP_HD float floor_in_range(float x) {
#if defined(__CUDA_ARCH__) || defined(__SSE4_1__) || !(defined(__x86_64__) || defined(_M_X64))
  return std::floor(x);
#else
  const float t = static_cast<float>(static_cast<int32_t>(x));
  return t - (t > x ? 1.0f : 0.0f);
#endif
}

// exp(x) for the float path, in plain arithmetic so that loops of it
// vectorize (libm's expf is a call per element; GELU's tanhf was 7% of a
// GPT-2 124M step). Cephes' expf: x = n ln 2 + r with |r| <= ln 2 / 2, a
// degree-6 polynomial for e^r, 2^n from the exponent bits; relative error
// about 2 ulp. x is clamped to [-87, 88], where 2^n stays a normal float:
// exp(-87) = 1.6e-38 stands for anything smaller. NaN gives NaN (so a
// diverged loss still shows as non-finite gradients). Selects, not
// branches, so loops of it vectorize (with -fno-trapping-math:
// models/CMakeLists.txt).
MP_HD float exp_approx(float x) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const float xl = x < -87.0f ? -87.0f : x;
  const float xc = x == x ? (xl > 88.0f ? 88.0f : xl) : 0.0f;
  const float fx = xc * kLog2e + 0.5f;
  const float n = floor_in_range(fx);
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  const float p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r +
                   1.6666665459e-1f) * r + 5.0000001201e-1f;
  const float e = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
#if defined(__CUDA_ARCH__)
  const float scale = __int_as_float(bits);
#else
  const float scale = std::bit_cast<float>(bits);
#endif
  const float result = e * scale;
  return x == x ? result : x;  // NaN in, NaN out
}

// The exp of the op math: exp_approx for float, the exact exp for the
// double reference.
template <class T>
MP_HD T gpt_exp(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return exp_approx(x);
  } else {
    return std::exp(x);
  }
}

// GPT-2's gelu, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3),
// is x sigmoid(2 u): 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2 u)). One exp, no
// tanh.
template <class T>
MP_HD T gelu(T x) {
  const auto s = static_cast<T>(kGeluSqrt2OverPi), a = static_cast<T>(kGeluCubic);
  const T u = s * (x + a * x * x * x);
  return x / (T(1) + gpt_exp(T(-2) * u));
}

// d gelu / dx = sigmoid(2u) + 2 x sigmoid(2u) (1 - sigmoid(2u)) u'(x), using
// 1 - tanh(u)^2 = 4 sigmoid(2u) (1 - sigmoid(2u)).
template <class T>
MP_HD T gelu_grad(T x) {
  const auto s = static_cast<T>(kGeluSqrt2OverPi), a = static_cast<T>(kGeluCubic);
  const T u = s * (x + a * x * x * x);
  const T sig = T(1) / (T(1) + gpt_exp(T(-2) * u));
  return sig + T(2) * x * sig * (T(1) - sig) * s * (T(1) + T(3) * a * x * x);
}

// LayerNorm of one element, given its row's mean and 1 / sqrt(var + eps).
template <class T>
MP_HD T layernorm(T x, T mean, T rstd, T w, T b) {
  return (x - mean) * rstd * w + b;
}

// LayerNorm's input gradient of one element: with dnorm = w g and
// norm = (x - mean) rstd, dx = (dnorm - mean(dnorm) - norm mean(dnorm norm)) rstd.
// wg = w * g of this element; the two means are over its row.
template <class T>
MP_HD T layernorm_dx(T x, T mean, T rstd, T wg, T dnorm_mean, T dnorm_norm_mean) {
  const T norm = (x - mean) * rstd;
  return (wg - dnorm_mean - norm * dnorm_norm_mean) * rstd;
}

}  // namespace mp::math

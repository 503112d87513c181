// Gradient accumulation loops (kernels/cpu/accumulate.h) against a plain
// float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/accumulate.h"

namespace mp {
namespace {

float value(int64_t i, int k) { return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + k) * (1 + i % 7)); }

TEST(Accumulate, EveryDtypePairRoundsTheFp32SumOnce) {
  const int64_t n = 100003;  // odd: no vector width divides it
  for (DType dst_t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType src_t : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::string(dtype_name(src_t)) + " into " + std::string(dtype_name(dst_t)));
      std::vector<uint8_t> dst(static_cast<size_t>(n) * dtype_size(dst_t));
      std::vector<uint8_t> src(static_cast<size_t>(n) * dtype_size(src_t));
      std::vector<float> expect(static_cast<size_t>(n));
      // Reference: element by element with the scalar conversion functions.
      auto load = [](const std::vector<uint8_t>& b, DType t, int64_t i) {
        return dispatch_dtype(t, [&](auto tag) { return math::to_f32(reinterpret_cast<const decltype(tag)*>(b.data())[i]); });
      };
      auto store = [](std::vector<uint8_t>& b, DType t, int64_t i, float v) {
        dispatch_dtype(t, [&](auto tag) {
          using T = decltype(tag);
          reinterpret_cast<T*>(b.data())[i] = math::from_f32<T>(v);
        });
      };
      for (int k = 0; k < 3; ++k) {
        for (int64_t i = 0; i < n; ++i) store(src, src_t, i, value(i, k));
        accumulate_cpu(dst.data(), dst_t, src.data(), src_t, n, k == 0);
        for (int64_t i = 0; i < n; ++i) {
          const float s = load(src, src_t, i);
          const float sum = k == 0 ? s : expect[static_cast<size_t>(i)] + s;
          std::vector<uint8_t> one(dtype_size(dst_t));
          dispatch_dtype(dst_t, [&](auto tag) {
            using T = decltype(tag);
            *reinterpret_cast<T*>(one.data()) = math::from_f32<T>(sum);
            expect[static_cast<size_t>(i)] = math::to_f32(*reinterpret_cast<const T*>(one.data()));
          });
        }
      }
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) bad += load(dst, dst_t, i) != expect[static_cast<size_t>(i)] ? 1 : 0;
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(Accumulate, Fp64BlocksAddInBlockOrderAndRoundOnce) {
  const int64_t n = 70001, stride = 70011;
  const int blocks = 5;
  std::vector<float> src(static_cast<size_t>(stride * blocks));
  for (int k = 0; k < blocks; ++k) {
    for (int64_t i = 0; i < n; ++i) src[static_cast<size_t>(k * stride + i)] = value(i, k) * std::ldexp(1.0f, k * 9 - 20);
  }
  std::vector<double> acc(static_cast<size_t>(n), 0.5);
  accumulate_f64_cpu(acc.data(), src.data(), blocks, stride, n);
  std::vector<float> out(static_cast<size_t>(n));
  round_f64_cpu(acc.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    double e = 0.5;
    for (int k = 0; k < blocks; ++k) e += static_cast<double>(src[static_cast<size_t>(k * stride + i)]);
    ASSERT_EQ(acc[static_cast<size_t>(i)], e) << "element " << i;
    ASSERT_EQ(out[static_cast<size_t>(i)], static_cast<float>(e)) << "element " << i;
  }
}

TEST(Accumulate, BadArgumentsAreRejected) {
  float a = 0, b = 0;
  EXPECT_THROW(accumulate_cpu(&a, DType::kF8E4M3, &b, DType::kF32, 1, true), EnforceError);
  EXPECT_THROW(accumulate_cpu(nullptr, DType::kF32, &b, DType::kF32, 1, true), EnforceError);
  double d = 0;
  EXPECT_THROW(accumulate_f64_cpu(&d, &b, 2, 0, 1), EnforceError);
}

}  // namespace
}  // namespace mp

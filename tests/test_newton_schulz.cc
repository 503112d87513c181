// kernels/cpu/newton_schulz.h: Muon's Newton-Schulz iteration in fp32 and
// bf16 against the float64 reference (tests/muon_reference.h) on wide, tall,
// square and odd shapes, within tolerances from the rounding-error model of
// Note [Newton-Schulz tolerances]; the singular values of the result in the
// quintic's band; the same bits for any thread count, in place or not, with
// the caller's scratch or the thread's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/newton_schulz.h"
#include "tests/muon_reference.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::ref_distance;
using testing::ref_norm;
using testing::sci;

struct Shape2 {
  int64_t rows, cols;
};
// Wide, tall (the iteration runs on the transpose), square, and one whose
// sides are multiples of nothing the GEMM tiles by.
const Shape2 kShapes[] = {{48, 64}, {64, 48}, {96, 96}, {37, 53}};

std::string name_of(Shape2 s, DType dtype) {
  return std::to_string(s.rows) + "x" + std::to_string(s.cols) + " " + std::string(dtype_name(dtype));
}

std::vector<float> run_ns(const std::vector<float>& g, Shape2 s, const NewtonSchulzOptions& o) {
  std::vector<float> out(g.size());
  newton_schulz_cpu(g.data(), out.data(), s.rows, s.cols, o);
  return out;
}

NewtonSchulzOptions options(DType dtype, int threads = 0) {
  NewtonSchulzOptions o;
  o.dtype = dtype;
  o.threads = threads;
  return o;
}

// The scalar quintic applied `steps` times.
double quintic(double s, const NewtonSchulzOptions& o) {
  for (int k = 0; k < o.steps; ++k) s = o.a * s + o.b * s * s * s + o.c * s * s * s * s * s;
  return s;
}

void expect_matches_reference(DType dtype) {
  uint32_t seed = 100;
  for (const Shape2 s : kShapes) {
    const std::vector<float> g = testing::random_values(static_cast<size_t>(s.rows * s.cols), ++seed);
    const NewtonSchulzOptions o = options(dtype);
    const std::vector<float> x = run_ns(g, s, o);
    const std::vector<double> gd = testing::to_double(g);
    const std::vector<double> y = testing::ns_reference(gd, s.rows, s.cols, o);
    const double rho = ref_distance(testing::to_double(x), y) / ref_norm(y);
    const double tol = testing::ns_tolerance(gd, s.rows, s.cols, o, seed);
    EXPECT_LE(rho, tol) << name_of(s, dtype);
    ::testing::Test::RecordProperty("rho " + name_of(s, dtype), sci(rho) + " (tolerance " + sci(tol) + ")");
    if (dtype == DType::kBF16) {
      for (float v : x) ASSERT_EQ(math::bf16_bits_to_f32(math::f32_to_bf16_bits(v)), v) << "not a bf16 value";
    }
  }
}

TEST(NewtonSchulz, Fp32MatchesTheFloat64Reference) { expect_matches_reference(DType::kF32); }

TEST(NewtonSchulz, Bf16MatchesTheFloat64Reference) { expect_matches_reference(DType::kBF16); }

// The smallest normalized singular value the quintic carries into [0.68,
// 1.21] in o.steps steps, and on (on a grid of 1e-6): p maps [0.5545,
// 1.2024] onto [0.6818, 1.2024] (p(1.05) = 0.6818 is its minimum there,
// p(0.5545) = 1.2024 its maximum) and [0, 1.2024] into itself, but a small
// s grows only by about a = 3.44 per step. 0.0015 for the defaults.
double band_reach(const NewtonSchulzOptions& o) {
  double reach = 0.0;
  for (int i = 1; i <= 1000000; ++i) {
    const double s = i * 1e-6, v = quintic(s, o);
    if (v < 0.68 || v > 1.21) reach = s + 1e-6;
  }
  return reach;
}

// The reference's singular values are the scalar quintic's images of the
// normalized input's (checks the reference and the SVD); those whose input
// was not too small (band_reach) lie in the band [0.68, 1.21], and all below
// 1.21. The library's are within ||X - Y||_2 of the reference's (Weyl's
// inequality).
TEST(NewtonSchulz, SingularValuesLieInTheQuinticsBand) {
  const double reach = band_reach(options(DType::kF32));
  EXPECT_NEAR(reach, 0.0015, 1e-4);
  uint32_t seed = 200;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Shape2 s : kShapes) {
      const std::vector<float> g = testing::random_values(static_cast<size_t>(s.rows * s.cols), ++seed);
      const NewtonSchulzOptions o = options(dtype);
      const std::vector<double> gd = testing::to_double(g);
      const std::vector<double> y = testing::ns_reference(gd, s.rows, s.cols, o);
      const std::vector<double> sv_y = testing::ref_singular_values(y, s.rows, s.cols);

      const std::vector<double> sv_g = testing::ref_singular_values(gd, s.rows, s.cols);
      const double norm = ref_norm(gd);
      std::vector<std::pair<double, bool>> expected;  // p^5(s / ||G||), and whether s reaches the band
      for (double v : sv_g) expected.emplace_back(quintic(v / norm, o), v / norm >= reach);
      std::sort(expected.begin(), expected.end());
      int reached = 0;
      for (size_t i = 0; i < expected.size(); ++i) {
        ASSERT_NEAR(sv_y[i], expected[i].first, 1e-9) << name_of(s, dtype);
        EXPECT_LE(sv_y[i], 1.21) << name_of(s, dtype);
        if (expected[i].second) {
          EXPECT_GE(sv_y[i], 0.68) << name_of(s, dtype);
          ++reached;
        }
      }

      const std::vector<double> x = testing::to_double(run_ns(g, s, o));
      std::vector<double> diff(x.size());
      for (size_t i = 0; i < x.size(); ++i) diff[i] = x[i] - y[i];
      const double weyl = testing::ref_singular_values(diff, s.rows, s.cols).back();
      const std::vector<double> sv_x = testing::ref_singular_values(x, s.rows, s.cols);
      for (size_t i = 0; i < sv_x.size(); ++i) {
        ASSERT_NEAR(sv_x[i], sv_y[i], weyl * (1 + 1e-9) + 1e-12) << name_of(s, dtype) << " singular value " << i;
      }
      ::testing::Test::RecordProperty(
          "band " + name_of(s, dtype),
          "[" + std::to_string(sv_x.front()) + ", " + std::to_string(sv_x.back()) + "], " + std::to_string(reached) +
              " of " + std::to_string(sv_x.size()) + " reached the band; ||X - Y||_2 " + sci(weyl));
    }
  }
}

TEST(NewtonSchulz, SameBitsForAnyThreadCount) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Shape2 s : {Shape2{96, 40}, Shape2{40, 96}, Shape2{37, 53}}) {
      const std::vector<float> g = testing::random_values(static_cast<size_t>(s.rows * s.cols), 7);
      const std::vector<float> one = run_ns(g, s, options(dtype, 1));
      for (int threads : {2, 3}) {
        const std::vector<float> many = run_ns(g, s, options(dtype, threads));
        EXPECT_TRUE(testing::same_bits(one, many)) << name_of(s, dtype) << " with " << threads << " threads";
      }
    }
  }
}

TEST(NewtonSchulz, InPlaceAndTheCallersScratchGiveTheSameBits) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const Shape2 s{53, 37};
    const NewtonSchulzOptions o = options(dtype);
    const std::vector<float> g = testing::random_values(static_cast<size_t>(s.rows * s.cols), 9);
    const std::vector<float> expected = run_ns(g, s, o);

    std::vector<float> in_place = g;
    newton_schulz_cpu(in_place.data(), in_place.data(), s.rows, s.cols, o);
    EXPECT_TRUE(testing::same_bits(in_place, expected)) << dtype_name(dtype);

    const int64_t need = newton_schulz_scratch_elements(s.rows, s.cols, o);
    std::vector<float> scratch(static_cast<size_t>(need), std::nanf(""));
    std::vector<float> out(g.size());
    newton_schulz_cpu(g.data(), out.data(), s.rows, s.cols, o, scratch.data(), need);
    EXPECT_TRUE(testing::same_bits(out, expected)) << dtype_name(dtype);

    const std::string message = testing::error_of<EnforceError>(
        [&] { newton_schulz_cpu(g.data(), out.data(), s.rows, s.cols, o, scratch.data(), need - 1); });
    EXPECT_TRUE(testing::contains(message, "scratch of " + std::to_string(need - 1))) << message;
  }
}

// A zero matrix stays zero (the norm's floor eps), as in torch.
TEST(NewtonSchulz, ZeroStaysZero) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const std::vector<float> zeros(12 * 20, 0.0f);
    const std::vector<float> out = run_ns(zeros, Shape2{12, 20}, options(dtype));
    EXPECT_TRUE(testing::same_bits(out, zeros)) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace mp

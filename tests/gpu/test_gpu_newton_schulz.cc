// GPU tests (label "gpu"): Muon's Newton-Schulz iteration on the device
// (kernels/cuda/newton_schulz_cuda.h) in fp32 and bf16 against the float64
// reference, within the tolerances the CPU iteration is held to (Note
// [Newton-Schulz tolerances] in tests/muon_reference.h), on wide, tall,
// square and odd shapes; close to the CPU iteration; the same bits run to
// run and in place; a short scratch refused.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/newton_schulz.h"
#include "kernels/cuda/newton_schulz_cuda.h"
#include "tests/gpu/gpu_data.h"
#include "tests/gpu/gpu_test.h"
#include "tests/muon_reference.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::DeviceVector;
using testing::ref_distance;
using testing::ref_norm;

class GpuNewtonSchulz : public testing::GpuStreamTest {
 protected:
  // NS(g) on the device: out of place, or in place when `in_place`.
  std::vector<float> run(const std::vector<float>& g, int64_t rows, int64_t cols, const NewtonSchulzOptions& o,
                         bool in_place = false) {
    const int64_t bytes = newton_schulz_cuda_scratch_bytes(rows, cols, o);
    DeviceVector<char> scratch(static_cast<size_t>(bytes), stream_);
    DeviceVector<float> in(g, stream_);
    DeviceVector<float> out(g.size(), stream_);
    float* dst = in_place ? in.get() : out.get();
    newton_schulz_cuda(in.get(), dst, rows, cols, o, scratch.get(), bytes, stream_);
    return in_place ? in.host() : out.host();
  }
};

struct Shape2 {
  int64_t rows, cols;
};
const Shape2 kShapes[] = {{48, 64}, {64, 48}, {96, 96}, {37, 53}, {256, 1024}};

TEST_F(GpuNewtonSchulz, MatchesTheFloat64ReferenceAndStaysNearTheCpu) {
  uint32_t seed = 300;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Shape2 s : kShapes) {
      const std::string what = std::to_string(s.rows) + "x" + std::to_string(s.cols) + " " +
                               std::string(dtype_name(dtype));
      NewtonSchulzOptions o;
      o.dtype = dtype;
      const std::vector<float> g = testing::random_values(static_cast<size_t>(s.rows * s.cols), ++seed);
      const std::vector<float> x = run(g, s.rows, s.cols, o);
      const std::vector<double> gd = testing::to_double(g);
      const std::vector<double> y = testing::ns_reference(gd, s.rows, s.cols, o);
      const double tol = testing::ns_tolerance(gd, s.rows, s.cols, o, seed);
      const double rho = ref_distance(testing::to_double(x), y) / ref_norm(y);
      EXPECT_LE(rho, tol) << what;
      std::vector<float> cpu(g.size());
      newton_schulz_cpu(g.data(), cpu.data(), s.rows, s.cols, o);
      // Both within tol of the reference: within 2 tol of each other.
      EXPECT_LE(ref_distance(testing::to_double(x), testing::to_double(cpu)) / ref_norm(y), 2 * tol) << what;
      ::testing::Test::RecordProperty("rho " + what, testing::sci(rho) + " (tolerance " + testing::sci(tol) + ")");
      if (dtype == DType::kBF16) {
        for (float v : x) ASSERT_EQ(math::bf16_bits_to_f32(math::f32_to_bf16_bits(v)), v) << what << ": not bf16";
      }
      testing::expect_same_bits(run(g, s.rows, s.cols, o), x, ("run to run, " + what).c_str());
      testing::expect_same_bits(run(g, s.rows, s.cols, o, /*in_place=*/true), x, ("in place, " + what).c_str());
    }
  }
}

TEST_F(GpuNewtonSchulz, ZeroStaysZeroAndAShortScratchIsRefused) {
  NewtonSchulzOptions o;
  const std::vector<float> zeros(32 * 48, 0.0f);
  for (float v : run(zeros, 32, 48, o)) ASSERT_EQ(v, 0.0f);
  DeviceVector<float> g(zeros, stream_);
  const int64_t bytes = newton_schulz_cuda_scratch_bytes(32, 48, o);
  DeviceVector<char> scratch(static_cast<size_t>(bytes), stream_);
  EXPECT_THROW(newton_schulz_cuda(g.get(), g.get(), 32, 48, o, scratch.get(), bytes - 1, stream_), EnforceError);
  EXPECT_THROW(newton_schulz_cuda_scratch_bytes(0, 48, o), EnforceError);
}

}  // namespace
}  // namespace mp

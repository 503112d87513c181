// Rank-chunk accumulation (kernels/cpu/reduce.h): the blocked fp32 sums and
// the generic loop against a plain float64 reference, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/convert_math.h"
#include "kernels/cpu/reduce.h"

namespace mp {
namespace {

float value(int64_t i, int k) {
  if (i % 997 == 5 && k == 1) return std::numeric_limits<float>::quiet_NaN();
  if (i % 1009 == 7) return k % 2 == 0 ? std::numeric_limits<float>::infinity() : 1.0f;
  if (i % 13 == 3) return 1e-41f * static_cast<float>(k + 1);  // subnormal in fp32
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + k) * std::ldexp(1.0, static_cast<int>(i % 40) - 20));
}

bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0; }

// n ranks' chunks of `count` elements in dtype In, summed into fp32 with
// `divisor`, out of place and in place over rank `alias`'s chunk.
template <class In>
void check_sums(DType in, int n, int64_t count, double divisor) {
  std::vector<std::vector<In>> chunks(static_cast<size_t>(n), std::vector<In>(static_cast<size_t>(count)));
  for (int k = 0; k < n; ++k) {
    for (int64_t i = 0; i < count; ++i) chunks[static_cast<size_t>(k)][static_cast<size_t>(i)] = math::from_f32<In>(value(i, k));
  }
  std::vector<float> want(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int k = 0; k < n; ++k) {
      const double x = static_cast<double>(math::to_f32(chunks[static_cast<size_t>(k)][static_cast<size_t>(i)]));
      sum = k == 0 ? x : sum + x;
    }
    want[static_cast<size_t>(i)] = static_cast<float>(sum / divisor);
  }
  std::vector<const void*> pieces;
  for (const auto& c : chunks) pieces.push_back(c.data());
  std::vector<float> out(static_cast<size_t>(count), -7.0f);
  accumulate_rank_pieces_cpu(pieces.data(), in, n, count, out.data(), DType::kF32, math::ElementOp::kSum, divisor);
  int64_t bad = 0;
  for (int64_t i = 0; i < count; ++i) bad += same(out[static_cast<size_t>(i)], want[static_cast<size_t>(i)]) ? 0 : 1;
  EXPECT_EQ(bad, 0) << dtype_name(in) << ", " << n << " ranks, " << count << " elements, divisor " << divisor;
  if constexpr (std::is_same_v<In, float>) {  // in place: the output over the last rank's chunk
    accumulate_rank_pieces_cpu(pieces.data(), in, n, count, chunks.back().data(), DType::kF32, math::ElementOp::kSum,
                               divisor);
    bad = 0;
    for (int64_t i = 0; i < count; ++i) bad += same(chunks.back()[static_cast<size_t>(i)], want[static_cast<size_t>(i)]) ? 0 : 1;
    EXPECT_EQ(bad, 0) << "in place, " << n << " ranks, " << count << " elements, divisor " << divisor;
  }
}

TEST(RankSums, Fp32AndBf16SumsIntoFp32AreTheFloat64SumRoundedOnce) {
  for (int n : {1, 2, 3, 8}) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{511}, int64_t{512}, int64_t{100003}}) {
      for (double divisor : {1.0, 2.0, 3.0}) {
        check_sums<float>(DType::kF32, n, count, divisor);
        check_sums<bf16>(DType::kBF16, n, count, divisor);
      }
    }
  }
}

TEST(RankSums, TheStridedFormAndTheGenericLoopAgreeWithTheElementMath) {
  const int n = 3;
  const int64_t count = 4099, stride = 5000;
  std::vector<bf16> chunks(static_cast<size_t>(n * stride));
  for (int k = 0; k < n; ++k) {
    for (int64_t i = 0; i < count; ++i) chunks[static_cast<size_t>(k * stride + i)] = math::from_f32<bf16>(value(i, k));
  }
  for (math::ElementOp op : {math::ElementOp::kSum, math::ElementOp::kMax, math::ElementOp::kMin}) {
    std::vector<float> f32(static_cast<size_t>(count));
    std::vector<bf16> b16(static_cast<size_t>(count));
    accumulate_rank_chunks_cpu(chunks.data(), DType::kBF16, n, stride, count, f32.data(), DType::kF32, op, 2.0);
    accumulate_rank_chunks_cpu(chunks.data(), DType::kBF16, n, stride, count, b16.data(), DType::kBF16, op, 3.0);
    std::vector<float> want_f32(static_cast<size_t>(count));
    std::vector<bf16> want_b16(static_cast<size_t>(count));
    int64_t bad = 0;
    for (int64_t i = 0; i < count; ++i) {
      math::accumulate_element(chunks.data(), n, stride, i, want_f32.data(), op, 2.0);
      math::accumulate_element(chunks.data(), n, stride, i, want_b16.data(), op, 3.0);
      bad += same(f32[static_cast<size_t>(i)], want_f32[static_cast<size_t>(i)]) ? 0 : 1;
      bad += same(math::to_f32(b16[static_cast<size_t>(i)]), math::to_f32(want_b16[static_cast<size_t>(i)])) ? 0 : 1;
    }
    EXPECT_EQ(bad, 0) << "op " << static_cast<int>(op);
  }
}

// Wire accumulation: reduce_pair_element folded in rank order (the MPI user
// op's bits), out of place and in place, for every op and 16/32-bit dtype.
template <class T>
void check_wire(DType t, int n, int64_t count, math::ElementOp op) {
  std::vector<std::vector<T>> chunks(static_cast<size_t>(n), std::vector<T>(static_cast<size_t>(count)));
  for (int k = 0; k < n; ++k) {
    for (int64_t i = 0; i < count; ++i) chunks[static_cast<size_t>(k)][static_cast<size_t>(i)] = math::from_f32<T>(value(i, k));
  }
  std::vector<T> want = chunks[0];
  for (int k = 1; k < n; ++k) {
    for (int64_t i = 0; i < count; ++i) math::reduce_pair_element(chunks[static_cast<size_t>(k)].data(), want.data(), i, op);
  }
  std::vector<const void*> pieces;
  for (const auto& c : chunks) pieces.push_back(c.data());
  auto bad_in = [&](const std::vector<T>& got) {
    int64_t bad = 0;
    for (int64_t i = 0; i < count; ++i) {
      bad += same(math::to_f32(got[static_cast<size_t>(i)]), math::to_f32(want[static_cast<size_t>(i)])) ? 0 : 1;
    }
    return bad;
  };
  std::vector<T> out(static_cast<size_t>(count));
  accumulate_rank_pieces_wire_cpu(pieces.data(), t, n, count, out.data(), op);
  EXPECT_EQ(bad_in(out), 0) << dtype_name(t) << ", " << n << " ranks, " << count << " elements, op " << static_cast<int>(op);
  const int mine = n / 2;  // in place over a middle rank's chunk, as an in-place reduce-scatter
  accumulate_rank_pieces_wire_cpu(pieces.data(), t, n, count, chunks[static_cast<size_t>(mine)].data(), op);
  EXPECT_EQ(bad_in(chunks[static_cast<size_t>(mine)]), 0) << "in place, " << dtype_name(t) << ", " << n << " ranks";
}

TEST(RankSums, WireAccumulationIsThePairwiseOpFoldedInRankOrder) {
  for (int n : {1, 2, 3, 5}) {
    for (int64_t count : {int64_t{1}, int64_t{513}, int64_t{20001}}) {
      for (math::ElementOp op : {math::ElementOp::kSum, math::ElementOp::kMax, math::ElementOp::kMin}) {
        check_wire<float>(DType::kF32, n, count, op);
        check_wire<bf16>(DType::kBF16, n, count, op);
        check_wire<fp16>(DType::kF16, n, count, op);
      }
    }
  }
}

}  // namespace
}  // namespace mp

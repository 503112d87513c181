// reduce_accumulate kFp32: bf16/fp16 on the wire, fp64 accumulation in rank
// order, one rounding. Checked against the float64 reference rounded once,
// for determinism, across world sizes, and against kWire's error.

#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>

#include "comm/mpi/mpi_communicator.h"
#include "tests/mpi/comm_test_util.h"
#include "tests/mpi/mpi_test.h"

namespace mp {
namespace {

using testing::equals_rounded;
using testing::fill;
using testing::rounded;

// Rank r's value at global index i: random but reproducible, with exponents
// 2^-10 .. 2^11 (finite in fp16), so fp64 sums of a few bf16 or fp16 terms
// are exact.
double random_value(int r, int64_t i) {
  uint64_t h = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(r) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64 finalizer
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  h ^= h >> 31;
  const double mantissa = 1.0 + static_cast<double>(h >> 11 & ((uint64_t{1} << 30) - 1)) * 0x1p-30;
  const double v = std::ldexp(mantissa, static_cast<int>(h % 21) - 10);
  return (h >> 63) ? -v : v;
}

class Accumulate : public testing::MpiTest {
 protected:
  std::unique_ptr<Communicator> make(size_t chunk_bytes) {
    CommOptions o;
    o.accumulate_chunk_bytes = chunk_bytes;
    return testing::make_world("accumulate", o);
  }
  // Sum over ranks of the inputs as sent (rounded to the wire dtype).
  double exact_sum(DType wire, int64_t i) const {
    double s = 0;
    for (int r = 0; r < size(); ++r) s += rounded(wire, random_value(r, i));
    return s;
  }
  Allocator alloc_;
};

TEST_F(Accumulate, ReduceScatterEqualsTheExactSumRoundedOnce) {
  const std::pair<DType, DType> kPairs[] = {
      {DType::kBF16, DType::kBF16}, {DType::kBF16, DType::kF32}, {DType::kF16, DType::kF16},
      {DType::kF16, DType::kF32}, {DType::kF32, DType::kF32}};
  // 256 bytes of scratch forces many rounds with uneven tails; 4 MiB is the default.
  for (size_t chunk_bytes : {size_t{256}, size_t{4} << 20}) {
    auto comm = make(chunk_bytes);
    for (const auto& pair : kPairs) {
      const DType wire = pair.first, out_dtype = pair.second;  // (clang 14 lambdas cannot capture bindings)
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
        if (chunk_bytes == 256 && n > 1000) continue;  // tiny chunks: keep the round count sane
        Tensor in = Tensor::empty(alloc_, wire, {n * size()}, MemCategory::kOther);
        fill(in, [&](int64_t i) { return random_value(rank(), i); });
        Tensor out = Tensor::empty(alloc_, out_dtype, {n}, MemCategory::kOther);
        comm->reduce_scatter(in, out, {ReduceOp::kSum, 1.0, ReduceAccumulate::kFp32})->wait();
        ASSERT_TRUE(equals_rounded(out, [&](int64_t i) { return exact_sum(wire, rank() * n + i); },
                                   std::string("kFp32 reduce_scatter ") + std::string(dtype_name(wire)) +
                                       " -> " + std::string(dtype_name(out_dtype)) + " n=" +
                                       std::to_string(n) + " chunk " + std::to_string(chunk_bytes)));
      }
    }
  }
}

TEST_F(Accumulate, AvgInPlaceAndAllReduce) {
  auto comm = make(256);
  const int64_t n = 999;  // not divisible by 2, 3 or 4
  Tensor x = Tensor::empty(alloc_, DType::kBF16, {n * size()}, MemCategory::kOther);
  fill(x, [&](int64_t i) { return random_value(rank(), i); });
  comm->reduce_scatter(x, x.flat(rank() * n, n), {ReduceOp::kAvg, 1.0, ReduceAccumulate::kFp32})->wait();
  ASSERT_TRUE(equals_rounded(x.flat(rank() * n, n),
                             [&](int64_t i) { return exact_sum(DType::kBF16, rank() * n + i) / size(); },
                             "in-place kFp32 avg reduce_scatter"));
  for (DType out_dtype : {DType::kBF16, DType::kF32}) {
    Tensor in = Tensor::empty(alloc_, DType::kBF16, {n}, MemCategory::kOther);
    fill(in, [&](int64_t i) { return random_value(rank(), i); });
    Tensor out = Tensor::empty(alloc_, out_dtype, {n}, MemCategory::kOther);
    comm->all_reduce(in, out, {ReduceOp::kSum, 2.0, ReduceAccumulate::kFp32})->wait();
    ASSERT_TRUE(equals_rounded(out, [&](int64_t i) { return exact_sum(DType::kBF16, i) / 2.0; },
                               "kFp32 all_reduce /2"));
  }
  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
    Tensor in = Tensor::empty(alloc_, DType::kF16, {n}, MemCategory::kOther);
    fill(in, [&](int64_t i) { return random_value(rank(), i); });
    comm->all_reduce(in, in, {op, 1.0, ReduceAccumulate::kFp32})->wait();
    ASSERT_TRUE(equals_rounded(in, [&](int64_t i) {
      double m = rounded(DType::kF16, random_value(0, i));
      for (int r = 1; r < size(); ++r) {
        const double v = rounded(DType::kF16, random_value(r, i));
        m = op == ReduceOp::kMax ? std::max(m, v) : std::min(m, v);
      }
      return m;
    }, "kFp32 all_reduce max/min"));
  }
}

TEST_F(Accumulate, BitwiseIdenticalAcrossRunsAndWorldSizes) {
  // Two contributions a and b live on ranks 0 and size()-1 (zeros elsewhere).
  // The result must be round(a + b) for every world size: identical bits at
  // np 1 (a only), 2, 3 and 4 apart from np 1, and identical across runs.
  auto comm = make(size_t{1} << 12);
  const int64_t n = 4096;
  auto contribution = [&](int r, int64_t i) {
    if (r == 0) return random_value(0, i);
    if (r == size() - 1) return random_value(1, i);
    return 0.0;
  };
  Tensor in = Tensor::empty(alloc_, DType::kBF16, {n * size()}, MemCategory::kOther);
  fill(in, [&](int64_t i) { return contribution(rank(), i % n); });
  std::vector<uint32_t> first;
  for (int run = 0; run < 3; ++run) {
    Tensor out = Tensor::empty(alloc_, DType::kBF16, {n}, MemCategory::kOther);
    comm->reduce_scatter(in, out, {ReduceOp::kSum, 1.0, ReduceAccumulate::kFp32})->wait();
    ASSERT_TRUE(equals_rounded(out, [&](int64_t i) {
      double s = rounded(DType::kBF16, random_value(0, i));
      if (size() > 1) s += rounded(DType::kBF16, random_value(1, i));
      return s;
    }, "contributions on ranks 0 and size()-1"));
    std::vector<uint32_t> bits(n);
    for (int64_t i = 0; i < n; ++i) bits[i] = testing::load_bits(out, i);
    if (run == 0) first = bits;
    ASSERT_EQ(bits, first) << "run " << run << " differs from run 0";
  }
}

TEST_F(Accumulate, MoreAccurateThanWireAccumulation) {
  // Sums of several terms of unlike magnitude: bf16 rounding at each hop
  // (kWire) loses what one final rounding keeps.
  if (size() < 3) GTEST_SKIP() << "needs at least 3 ranks to see per-hop rounding";
  auto comm = make(size_t{4} << 20);
  const int64_t n = 20000;
  Tensor in = Tensor::empty(alloc_, DType::kBF16, {n}, MemCategory::kOther);
  fill(in, [&](int64_t i) { return random_value(rank(), i) * (rank() == 0 ? 1.0 : 0.01); });
  Tensor wire = Tensor::empty(alloc_, DType::kBF16, {n}, MemCategory::kOther);
  Tensor fp32 = Tensor::empty(alloc_, DType::kBF16, {n}, MemCategory::kOther);
  comm->all_reduce(in, wire, {ReduceOp::kSum, 1.0, ReduceAccumulate::kWire})->wait();
  comm->all_reduce(in, fp32, {ReduceOp::kSum, 1.0, ReduceAccumulate::kFp32})->wait();
  int wire_wrong = 0, fp32_wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    double exact = 0;
    for (int r = 0; r < size(); ++r) exact += rounded(DType::kBF16, random_value(r, i) * (r == 0 ? 1.0 : 0.01));
    const uint32_t want = testing::ref_bits(DType::kBF16, exact);
    wire_wrong += testing::load_bits(wire, i) != want;
    fp32_wrong += testing::load_bits(fp32, i) != want;
  }
  EXPECT_EQ(fp32_wrong, 0);
  EXPECT_GT(wire_wrong, 0) << "kWire matched exact rounding everywhere: the test data is too easy";
}

// Note [Gloo backend]: on the same inputs Gloo's reductions give MPI's bits,
// the fp32-accumulating bf16 reduce-scatter above all, and the wire
// accumulation too (values whose sums round, at several round sizes).
TEST_F(Accumulate, GlooGivesTheBitsOfMpi) {
  for (size_t chunk_bytes : {size_t{256}, size_t{4} << 20}) {
    CommOptions o;
    o.accumulate_chunk_bytes = chunk_bytes;
    auto mpi = MpiCommunicator::create_world("accumulate.mpi", o);
    auto gloo = testing::make_gloo_world("accumulate.gloo", o);
    for (const auto& [wire, out_dtype, accumulate] :
         {std::tuple{DType::kBF16, DType::kBF16, ReduceAccumulate::kFp32},
          std::tuple{DType::kBF16, DType::kF32, ReduceAccumulate::kFp32},
          std::tuple{DType::kBF16, DType::kBF16, ReduceAccumulate::kWire},
          std::tuple{DType::kF32, DType::kF32, ReduceAccumulate::kWire}}) {
      for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{65537}}) {
        if (chunk_bytes == 256 && n > 1001) continue;
        Tensor in = Tensor::empty(alloc_, wire, {n * size()}, MemCategory::kOther);
        fill(in, [&](int64_t i) { return random_value(rank(), i) * (1 + i % 3) / 3.0; });
        const ReduceOptions ro{ReduceOp::kAvg, 1.0, accumulate};
        Tensor a = Tensor::empty(alloc_, out_dtype, {n}, MemCategory::kOther);
        Tensor b = Tensor::empty(alloc_, out_dtype, {n}, MemCategory::kOther);
        mpi->reduce_scatter(in, a, ro)->wait();
        gloo->reduce_scatter(in, b, ro)->wait();
        ASSERT_EQ(std::memcmp(a.data(), b.data(), static_cast<size_t>(n) * dtype_size(out_dtype)), 0)
            << "reduce_scatter " << dtype_name(wire) << " -> " << dtype_name(out_dtype) << " n=" << n;
        if (out_dtype != wire) continue;
        Tensor c = Tensor::empty(alloc_, wire, {n * size()}, MemCategory::kOther);
        Tensor d = Tensor::empty(alloc_, wire, {n * size()}, MemCategory::kOther);
        mpi->all_reduce(in, c, ro)->wait();
        gloo->all_reduce(in, d, ro)->wait();
        ASSERT_EQ(std::memcmp(c.data(), d.data(), static_cast<size_t>(n * size()) * dtype_size(wire)), 0)
            << "all_reduce " << dtype_name(wire) << " n=" << n;
      }
    }
  }
}

// Note [Same-host transfers]: ranks of one host message each other over
// their channels (every peer here, unless MP_GLOO_SAME_HOST=tcp), a split's
// members too, and an all-to-all of small chunks (sent inline) and of large
// ones (read by address) over them gives the exact values.
TEST_F(Accumulate, GlooSameHostPeersUseTheirChannels) {
  auto world = testing::make_gloo_world("channels", CommOptions{});
  auto* gloo = dynamic_cast<GlooCommunicator*>(world.get());
  ASSERT_NE(gloo, nullptr);
  const char* mode = std::getenv("MP_GLOO_SAME_HOST");
  const int want = mode != nullptr && std::string(mode) == "tcp" ? 0 : size() - 1;
  EXPECT_EQ(gloo->same_host_channels(), want);
  auto half = gloo->split(rank() % 2, rank(), "channels.half", CommOptions{});
  EXPECT_EQ(half->same_host_channels(), want == 0 ? 0 : half->size() - 1);
  for (int64_t n : {int64_t{3}, int64_t{40000}}) {  // inline, then by address
    Tensor in = Tensor::empty(alloc_, DType::kF32, {n * size()}, MemCategory::kOther);
    Tensor out = Tensor::empty(alloc_, DType::kF32, {n * size()}, MemCategory::kOther);
    fill(in, [&](int64_t i) { return rank() * 1e6 + static_cast<double>(i); });
    gloo->all_to_all(in, out)->wait();
    for (int64_t i = 0; i < n * size(); ++i) {
      ASSERT_EQ(out.data_as<float>()[i], static_cast<float>((i / n) * 1e6 + rank() * n + i % n)) << "n=" << n;
    }
  }
}

}  // namespace
}  // namespace mp

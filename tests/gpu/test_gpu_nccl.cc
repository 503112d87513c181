// GPU tests of the rank-chunk accumulation kernel and the NCCL communicator
// (CTest label "gpu"): every test skips when no CUDA device is present.
// - accumulate_rank_chunks_cuda gives the same bits as the CPU loop on
//   awkward data (NaN, Inf, denormals, every dtype pair, op and divisor).
// - The NCCL communicator, on one rank (as one GPU is what CI machines have),
//   its control plane MPI's world, or Gloo's with MP_TEST_COMM=gloo
//   (gpu_nccl_gloo: torchrun's bootstrap): every collective, dtype, awkward count,
//   in place and out of place, avg and divide factors, kFp32 accumulation
//   bit for bit against accumulate_rank_chunks_cpu, splits, barrier,
//   sequence numbers, scratch accounting and argument errors.
// Runs under `launch/mprun -np 1`; MPI is initialized only with a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "comm/mpi/mpi_world.h"
#include "core/cuda_stream.h"
#include "core/device.h"
#include "core/tensor.h"
#include "kernels/convert.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/reduce_cuda.h"
#include "mp/config.h"
#include "tests/gpu/gpu_test.h"
#include "tests/mpi/comm_test_util.h"
#if MP_WITH_NCCL
#include "comm/nccl/nccl_communicator.h"
#endif

namespace mp {
namespace {

using testing::equals_rounded;
using testing::exact_value;
using testing::fill;

const int64_t kCounts[] = {0, 1, 7, 1000, (1 << 20) + 3};
const DType kReduceTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
const DType kAllTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

using Gpu = testing::GpuTest;

// fp32 values with special cases first (zeros, Inf, NaN, denormals, values
// that round across a binade), then random bits and random magnitudes.
std::vector<float> awkward_floats(int64_t n, uint32_t seed) {
  std::vector<float> v;
  std::mt19937 rng(seed);
  for (uint32_t bits : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x00000001u,
                        0x80000003u, 0x3f808000u, 0x477ff000u, 0x43e80000u, 0x7f7fffffu}) {
    if (static_cast<int64_t>(v.size()) < n) v.push_back(math::f32_from_bits(bits));
  }
  while (static_cast<int64_t>(v.size()) < n) {
    const uint32_t r = static_cast<uint32_t>(rng());
    v.push_back(v.size() % 3 == 0 ? math::f32_from_bits(r)
                                  : std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng),
                                               static_cast<int>(r % 40) - 20));
  }
  return v;
}

// A host tensor of dtype t holding `values` converted (nearest-even).
Tensor host_tensor(Allocator& host, DType t, const std::vector<float>& values) {
  const auto n = static_cast<int64_t>(values.size());
  Tensor out = Tensor::empty(host, t, {n}, MemCategory::kOther);
  convert(Tensor::wrap(const_cast<float*>(values.data()), Device::cpu(), DType::kF32, {n}), out);
  return out;
}

// Uploads and downloads go on the test's stream and wait for it
// (testing::copy_on_stream): an upload is complete before the collective
// that reads it is issued, and a download, issued after the collective's
// Work has completed, sees its result.
Tensor to_device(Allocator& device, const Tensor& host, cudaStream_t stream) {
  Tensor d = Tensor::empty(device, host.dtype(), {host.numel()}, MemCategory::kOther);
  testing::copy_on_stream(d.data(), host.data(), host.size_bytes(), stream);
  return d;
}

Tensor device_zeros(Allocator& device, DType t, int64_t n, cudaStream_t stream) {
  Allocator host;
  return to_device(device, Tensor::zeros(host, t, {n}, MemCategory::kOther), stream);
}

Tensor to_host(Allocator& host, const Tensor& device, cudaStream_t stream) {
  Tensor h = Tensor::empty(host, device.dtype(), {device.numel()}, MemCategory::kOther);
  testing::copy_on_stream(h.data(), device.data(), device.size_bytes(), stream);
  return h;
}

// Bit-for-bit equality, except that any NaN equals any NaN: the fp64
// arithmetic of kernels/reduce_math.h canonicalizes NaN payloads on the GPU
// but not on x86, so only NaN-ness is shared.
::testing::AssertionResult same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  if (got.dtype() != want.dtype() || got.numel() != want.numel()) {
    return ::testing::AssertionFailure() << what << ": shapes differ";
  }
  for (int64_t i = 0; i < got.numel(); ++i) {
    const uint32_t g = testing::load_bits(got, i), w = testing::load_bits(want, i);
    if (g == w || (std::isnan(testing::load_value(got, i)) && std::isnan(testing::load_value(want, i)))) continue;
    return ::testing::AssertionFailure() << what << ": element " << i << " got bits 0x" << std::hex << g
                                         << " want 0x" << w;
  }
  return ::testing::AssertionSuccess();
}

TEST_F(Gpu, AccumulateRankChunksMatchesCpuBitForBit) {
  Allocator host, device(Device::cuda(0));
  CudaStream stream(Device::cuda(0), "accumulate");
  const math::ElementOp kElementOps[] = {math::ElementOp::kSum, math::ElementOp::kMax, math::ElementOp::kMin};
  for (DType in : kReduceTypes) {
    for (DType out : kReduceTypes) {
      for (int chunks : {1, 2, 3, 5}) {
        for (math::ElementOp op : kElementOps) {
          for (double divisor : {1.0, 3.0, 0.125}) {
            // Chunks of `count` elements `stride` apart, the gaps filled too.
            const int64_t count = (in == DType::kF32 && out == DType::kF32 && chunks == 3) ? (1 << 20) + 3 : 4099;
            const int64_t stride = count + 5;
            Tensor src = host_tensor(host, in, awkward_floats(stride * chunks, static_cast<uint32_t>(chunks)));
            Tensor want = Tensor::zeros(host, out, {count}, MemCategory::kOther);
            accumulate_rank_chunks_cpu(src.data(), in, chunks, stride, count, want.data(), out, op, divisor);
            Tensor src_d = to_device(device, src, stream.handle());
            Tensor out_d = device_zeros(device, out, count, stream.handle());
            accumulate_rank_chunks_cuda(src_d.data(), in, chunks, stride, count, out_d.data(), out, op, divisor,
                                        stream.handle());
            ASSERT_TRUE(same_bits(to_host(host, out_d, stream.handle()), want,
                                   std::string(dtype_name(in)) + " -> " + std::string(dtype_name(out)) + " x" +
                                       std::to_string(chunks) + " op " + std::to_string(static_cast<int>(op)) +
                                       " / " + std::to_string(divisor)));
          }
        }
      }
    }
  }
  // Zero elements launch nothing; fp8 is refused.
  accumulate_rank_chunks_cuda(nullptr, DType::kBF16, 2, 0, 0, nullptr, DType::kF32, math::ElementOp::kSum, 1.0,
                              stream.handle());
  EXPECT_THROW(accumulate_rank_chunks_cuda(nullptr, DType::kF8E4M3, 1, 1, 1, nullptr, DType::kF32,
                                           math::ElementOp::kSum, 1.0, stream.handle()),
               EnforceError);
}

#if MP_WITH_NCCL

// One-rank NCCL communicator over the test's world (testing::make_world). Expected values: with one
// rank every reduction of exact_value(0, i) is the value itself (avg / 1).
class NcclSelf : public Gpu {
 protected:
  void SetUp() override {
    Gpu::SetUp();
    if (IsSkipped()) return;
    stream_ = std::make_unique<CudaStream>(Device::cuda(0), "test");
    comm_ = make(CommOptions{});
  }
  void TearDown() override {
    comm_.reset();
    stream_.reset();
  }

  std::unique_ptr<NcclCommunicator> make(CommOptions o) {
    return NcclCommunicator::create(testing::make_world("self (host)", o), Device::cuda(0), "self", o);
  }

  Tensor zeros(DType t, int64_t n) { return device_zeros(device_, t, n, stream()); }
  Tensor download(const Tensor& device) { return to_host(host_, device, stream()); }
  // The test's own stream, for uploads and downloads; made after SetUp has found a device.
  cudaStream_t stream() const { return stream_->handle(); }

  // A device tensor of n elements of t filled with exact_value(0, i).
  Tensor exact_device(DType t, int64_t n) {
    Tensor h = Tensor::empty(host_, t, {n}, MemCategory::kOther);
    fill(h, [](int64_t i) { return exact_value(0, i); });
    return to_device(device_, h, stream());
  }

  static std::string label(const char* op, DType t, int64_t n, bool in_place, const std::string& extra = "") {
    return std::string(op) + " " + std::string(dtype_name(t)) + " n=" + std::to_string(n) +
           (in_place ? " in-place" : " out-of-place") + extra;
  }

  Allocator host_;
  Allocator device_{Device::cuda(0)};
  std::unique_ptr<CudaStream> stream_;
  std::unique_ptr<NcclCommunicator> comm_;
};

TEST_F(NcclSelf, ReportsItsShape) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
  EXPECT_EQ(comm_->device(), Device::cuda(0));
  EXPECT_EQ(comm_->name(), "self");
  EXPECT_NE(cuda_handle(&comm_->stream()), nullptr);
  EXPECT_FALSE(comm_->aborted());
}

TEST_F(NcclSelf, AllReduce) {
  for (DType t : kReduceTypes) {
    for (ReduceOp op : kOps) {
      for (int64_t n : kCounts) {
        for (bool in_place : {false, true}) {
          Tensor in = exact_device(t, n);
          Tensor out = in_place ? in : zeros(t, n);
          comm_->all_reduce(in, out, {op})->wait();
          ASSERT_TRUE(equals_rounded(download(out), [](int64_t i) { return exact_value(0, i); },
                                     label("all_reduce", t, n, in_place, " " + std::string(reduce_op_name(op)))));
        }
      }
    }
  }
}

TEST_F(NcclSelf, ReduceScatter) {
  for (DType t : kReduceTypes) {
    for (ReduceOp op : kOps) {
      for (int64_t n : kCounts) {
        for (bool in_place : {false, true}) {
          Tensor in = exact_device(t, n);
          Tensor out = in_place ? in.flat(0, n) : zeros(t, n);
          comm_->reduce_scatter(in, out, {op})->wait();
          ASSERT_TRUE(equals_rounded(download(out), [](int64_t i) { return exact_value(0, i); },
                                     label("reduce_scatter", t, n, in_place, " " + std::string(reduce_op_name(op)))));
        }
      }
    }
  }
}

TEST_F(NcclSelf, DivideFactorIsAppliedAfterTheAverageInEveryPath) {
  for (DType t : kReduceTypes) {
    for (ReduceAccumulate acc : {ReduceAccumulate::kWire, ReduceAccumulate::kFp32}) {
      for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kSum, ReduceOp::kMax}) {
        const std::string what = " /3 " + std::string(reduce_op_name(op)) + (acc == ReduceAccumulate::kFp32 ? " fp32" : " wire");
        Tensor x = exact_device(t, 1000);
        comm_->all_reduce(x, x, {op, 3.0, acc})->wait();
        ASSERT_TRUE(equals_rounded(download(x), [](int64_t i) { return exact_value(0, i) / 3.0; },
                                   label("all_reduce", t, 1000, true, what)));
        Tensor y = exact_device(t, 1000);
        Tensor z = zeros(t, 1000);
        comm_->reduce_scatter(y, z, {op, 3.0, acc})->wait();
        ASSERT_TRUE(equals_rounded(download(z), [](int64_t i) { return exact_value(0, i) / 3.0; },
                                   label("reduce_scatter", t, 1000, false, what)));
      }
    }
  }
}

TEST_F(NcclSelf, AllGatherBroadcastAllToAll) {
  for (DType t : kAllTypes) {
    for (int64_t n : kCounts) {
      for (bool in_place : {false, true}) {
        auto want = [](int64_t i) { return exact_value(0, i); };
        Tensor out = in_place ? exact_device(t, n) : zeros(t, n);
        Tensor in = in_place ? out.flat(0, n) : exact_device(t, n);
        comm_->all_gather(in, out)->wait();
        ASSERT_TRUE(equals_rounded(download(out), want, label("all_gather", t, n, in_place)));

        Tensor b = exact_device(t, n);
        comm_->broadcast(b, 0)->wait();
        ASSERT_TRUE(equals_rounded(download(b), want, label("broadcast", t, n, in_place)));

        Tensor a_in = exact_device(t, n);
        Tensor a_out = in_place ? a_in : zeros(t, n);
        comm_->all_to_all(a_in, a_out)->wait();
        ASSERT_TRUE(equals_rounded(download(a_out), want, label("all_to_all", t, n, in_place)));

        if (in_place) continue;  // all_to_all_v never is
        Tensor v_out = zeros(t, n);
        const std::vector<int64_t> counts = {n};
        comm_->all_to_all_v(exact_device(t, n), counts, v_out, counts)->wait();
        ASSERT_TRUE(equals_rounded(download(v_out), want, label("all_to_all_v", t, n, in_place)));
      }
    }
  }
}

// kFp32 on one rank is accumulate_rank_chunks over one chunk: the result
// must be the CPU loop's, bit for bit, on awkward (inexact) data, in every
// dtype pair, with scratch small enough to force many rounds.
TEST_F(NcclSelf, Fp32AccumulationEqualsTheCpuLoopBitForBit) {
  const std::pair<DType, DType> kPairs[] = {
      {DType::kBF16, DType::kBF16}, {DType::kBF16, DType::kF32}, {DType::kF16, DType::kF16},
      {DType::kF16, DType::kF32},   {DType::kF32, DType::kF32},  {DType::kF32, DType::kBF16}};
  for (size_t chunk_bytes : {size_t{64}, size_t{4} << 20}) {
    CommOptions o;
    o.accumulate_chunk_bytes = chunk_bytes;
    auto comm = make(o);
    for (auto [wire, out_dtype] : kPairs) {
      for (int64_t n : kCounts) {
        if (chunk_bytes == 64 && n > 1000) continue;  // tiny chunks: keep the round count sane
        for (ReduceOp op : kOps) {
          for (bool all_reduce : {false, true}) {
            const double divisor = op == ReduceOp::kMin ? 1.0 : 3.0;
            Tensor in_h = host_tensor(host_, wire, awkward_floats(n, 11));
            Tensor want = Tensor::zeros(host_, out_dtype, {n}, MemCategory::kOther);
            const math::ElementOp eop = op == ReduceOp::kMax   ? math::ElementOp::kMax
                                        : op == ReduceOp::kMin ? math::ElementOp::kMin
                                                               : math::ElementOp::kSum;
            accumulate_rank_chunks_cpu(in_h.data(), wire, 1, n, n, want.data(), out_dtype, eop, divisor);
            Tensor in = to_device(device_, in_h, stream());
            Tensor out = zeros(out_dtype, n);
            const ReduceOptions ro{op, divisor, ReduceAccumulate::kFp32};
            WorkPtr w = all_reduce ? comm->all_reduce(in, out, ro) : comm->reduce_scatter(in, out, ro);
            w->wait();
            ASSERT_TRUE(same_bits(download(out), want,
                                   std::string(all_reduce ? "all_reduce " : "reduce_scatter ") +
                                       std::string(dtype_name(wire)) + " -> " + std::string(dtype_name(out_dtype)) +
                                       " " + std::string(reduce_op_name(op)) + " n=" + std::to_string(n) +
                                       " chunk " + std::to_string(chunk_bytes)));
          }
        }
      }
    }
    // One scratch buffer, allocated once and reused.
    EXPECT_EQ(comm->memory().current(MemCategory::kCommScratch), chunk_bytes);
    EXPECT_EQ(comm->memory().total_allocations, 1u);
  }
}

TEST_F(NcclSelf, SequenceNumbersFencesAndBarriers) {
  Tensor x = exact_device(DType::kBF16, 7);
  WorkPtr a = comm_->all_reduce(x, x, {});
  WorkPtr b = comm_->barrier();
  WorkPtr c = comm_->broadcast(x, 0);
  WorkPtr f = comm_->fence("after broadcast");
  EXPECT_EQ(a->info().sequence, 1u);
  EXPECT_EQ(b->info().sequence, 2u);
  EXPECT_EQ(c->info().sequence, 3u);
  EXPECT_EQ(a->info().op, "all_reduce");
  EXPECT_EQ(b->info().op, "barrier");
  EXPECT_EQ(f->info().sequence, 3u);
  EXPECT_EQ(f->info().op, "after broadcast");
  f->wait();
  EXPECT_TRUE(a->is_completed() && b->is_completed() && c->is_completed());
  comm_->barrier()->wait();
  // The barrier's int and nothing else yet: no kFp32 op has run.
  EXPECT_EQ(comm_->memory().current(MemCategory::kCommScratch), sizeof(int32_t));
  // A compute stream orders itself after a collective without a host sync.
  CudaStream compute(Device::cuda(0), "compute");
  WorkPtr d = comm_->all_reduce(x, x, {ReduceOp::kSum, 2.0});
  d->wait_on(compute);
  testing::PinnedHost pinned(DType::kBF16, 7);  // a stream copy's host side is pinned (core/pinned.h)
  const Tensor& back = pinned.tensor();
  copy_tensor(back, x, &compute);
  compute.synchronize();
  EXPECT_TRUE(equals_rounded(back, [](int64_t i) { return exact_value(0, i) / 2.0; }, "all_reduce /2 via wait_on"));
}

TEST_F(NcclSelf, SplitGivesAWorkingChildOrNothing) {
  std::unique_ptr<Communicator> child = comm_->split(0, 0, "child");
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->size(), 1);
  EXPECT_EQ(child->name(), "child");
  Tensor x = exact_device(DType::kF32, 1000);
  child->all_reduce(x, x, {ReduceOp::kAvg})->wait();
  EXPECT_TRUE(equals_rounded(download(x), [](int64_t i) { return exact_value(0, i); }, "child all_reduce"));
  EXPECT_EQ(comm_->split(-1, 0, "none"), nullptr);
  // The split counted as a collective of the parent.
  EXPECT_EQ(comm_->barrier()->info().sequence, 3u);
}

TEST_F(NcclSelf, BadArgumentsAndAbortAreTypedErrors) {
  Tensor f8 = zeros(DType::kF8E4M3, 8);
  EXPECT_THROW(comm_->all_reduce(f8, f8, {}), ConfigError);
  EXPECT_THROW(comm_->reduce_scatter(f8, f8, {}), ConfigError);
  Tensor cpu = Tensor::zeros(host_, DType::kF32, {8}, MemCategory::kOther);
  EXPECT_THROW(comm_->all_reduce(cpu, cpu, {}), EnforceError);
  Tensor x = zeros(DType::kF32, 8);
  Tensor y = zeros(DType::kF32, 9);
  EXPECT_THROW(comm_->all_gather(x, y), EnforceError);
  EXPECT_THROW(comm_->all_reduce(x, x, {ReduceOp::kSum, 0.0}), EnforceError);
  Tensor wide = zeros(DType::kF32, 8);
  Tensor narrow = zeros(DType::kBF16, 8);
  EXPECT_THROW(comm_->all_reduce(narrow, wide, {}), EnforceError) << "kWire needs equal dtypes";
  comm_->all_reduce(narrow, wide, {ReduceOp::kSum, 1.0, ReduceAccumulate::kFp32})->wait();
  comm_->abort_communicator("test");
  EXPECT_TRUE(comm_->aborted());
  EXPECT_THROW(comm_->all_reduce(x, x, {}), CommError);
  EXPECT_THROW(comm_->barrier(), CommError);
}

#endif  // MP_WITH_NCCL

}  // namespace
}  // namespace mp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Without a device every test skips in SetUp; MPI is not even started.
  if (mp::cuda_info().device_count == 0) return RUN_ALL_TESTS();
  mp::MpiWorld world(&argc, &argv);
  return RUN_ALL_TESTS();
}

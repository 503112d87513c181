// bench/accuracy_bench.cc: suite "reduce_accuracy": how far bf16 reductions
// land from the exact sum, for reduce_accumulate kWire (a bf16 rounding at
// every step, as NCCL's rings do) and kFp32 (bf16 on the wire, fp64
// accumulation, one rounding).
// - all_reduce_bf16_npN: the real MPI path at this run's world size. The
//   inputs are N(0, 1) values rounded to bf16; the reference is their fp64
//   sum (an fp64 MPI_Allreduce).
// - ring_sim_bf16_nN: large N simulated on rank 0 in NCCL's ring order
//   (s = x0; s = bf16(s + xk) for k = 1..N-1) against one rounding of the
//   exact sum.
// value = the kWire error, ref_value = the kFp32 error (relative RMS),
// ratio = their quotient; lower is better. Extra fields give the worst error
// in bf16 ulps of the exact sum, and the fraction of elements that differ
// from the correctly rounded sum.
#include <mpi.h>

#include <cmath>
#include <random>

#include "bench/suites.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_error.h"
#include "kernels/convert_math.h"
#include "kernels/reduce_math.h"

namespace mp::bench {
namespace {

struct ErrorStats {
  double sum_sq_err = 0, sum_sq_ref = 0, max_ulp = 0;
  int64_t misrounded = 0, n = 0;

  void add(double got, double exact) {
    const double e = got - exact;
    sum_sq_err += e * e;
    sum_sq_ref += exact * exact;
    int exponent = 0;
    std::frexp(exact, &exponent);  // |exact| in [2^(e-1), 2^e): bf16 ulp 2^(e-8)
    const double ulp = std::ldexp(1.0, std::max(exponent - 8, -133));
    max_ulp = std::max(max_ulp, std::fabs(e) / ulp);
    misrounded += math::bf16_bits_to_f32(math::round_from_f64<bf16>(exact).bits) != static_cast<float>(got);
    ++n;
  }
  double rel_rms() const { return sum_sq_ref > 0 ? std::sqrt(sum_sq_err / sum_sq_ref) : 0; }
  double misrounded_fraction() const { return n ? static_cast<double>(misrounded) / n : 0; }
};

void emit(const Reporter& r, const std::string& name, const ErrorStats& wire, const ErrorStats& fp32) {
  r.emit({{"case", name},
          {"value", round_to(wire.rel_rms(), 6)},
          {"unit", "rel_rms_error"},
          {"ref", "fp32_accumulate"},
          {"ref_value", round_to(fp32.rel_rms(), 6)},
          {"ratio", fp32.rel_rms() > 0 ? round_to(wire.rel_rms() / fp32.rel_rms(), 3) : 0.0},
          {"better", "lower"},
          {"wire_max_ulp", round_to(wire.max_ulp, 3)},
          {"fp32_max_ulp", round_to(fp32.max_ulp, 3)},
          {"wire_misrounded_fraction", round_to(wire.misrounded_fraction(), 5)},
          {"fp32_misrounded_fraction", round_to(fp32.misrounded_fraction(), 5)}});
  r.note(name + ": wire rel RMS " + std::to_string(wire.rel_rms()) + ", fp32 accumulate " +
         std::to_string(fp32.rel_rms()) + ", misrounded " + std::to_string(wire.misrounded_fraction()) +
         " vs " + std::to_string(fp32.misrounded_fraction()));
}

void measure_world(const BenchContext& ctx) {
  const int64_t n = int64_t{1} << 20;
  auto comm = MpiCommunicator::create_world("accuracy", CommOptions{});
  Allocator alloc;
  Tensor in = Tensor::empty(alloc, DType::kBF16, {n}, MemCategory::kOther);
  std::vector<double> exact(static_cast<size_t>(n));
  std::mt19937_64 rng(1234 + static_cast<uint64_t>(ctx.world.rank()));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    in.data_as<bf16>()[i] = math::from_f32<bf16>(normal(rng));
    exact[i] = math::to_f32(in.data_as<bf16>()[i]);
  }
  MP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, exact.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                             ctx.world.comm()));
  Tensor wire = Tensor::empty(alloc, DType::kBF16, {n}, MemCategory::kOther);
  Tensor fp32 = Tensor::empty(alloc, DType::kBF16, {n}, MemCategory::kOther);
  comm->all_reduce(in, wire, {ReduceOp::kSum, 1.0, ReduceAccumulate::kWire})->wait();
  comm->all_reduce(in, fp32, {ReduceOp::kSum, 1.0, ReduceAccumulate::kFp32})->wait();
  ErrorStats w, f;
  for (int64_t i = 0; i < n; ++i) {
    w.add(math::to_f32(wire.data_as<bf16>()[i]), exact[i]);
    f.add(math::to_f32(fp32.data_as<bf16>()[i]), exact[i]);
  }
  emit(ctx.reporter, "all_reduce_bf16_np" + std::to_string(ctx.world.size()), w, f);
}

void simulate_rings(const BenchContext& ctx) {
  if (ctx.world.rank() != 0) return;
  const int64_t n = 65536;
  for (int ranks : {2, 4, 8, 16, 64, 256, 1024}) {
    std::mt19937_64 rng(99 + static_cast<uint64_t>(ranks));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    ErrorStats w, f;
    for (int64_t i = 0; i < n; ++i) {
      double exact = 0;
      float ring = 0;
      for (int k = 0; k < ranks; ++k) {
        const float x = math::to_f32(math::from_f32<bf16>(normal(rng)));
        exact += x;
        ring = k == 0 ? x : math::to_f32(math::round_from_f64<bf16>(static_cast<double>(ring) + x));
      }
      w.add(ring, exact);
      f.add(math::to_f32(math::round_from_f64<bf16>(exact)), exact);
    }
    emit(ctx.reporter, "ring_sim_bf16_n" + std::to_string(ranks), w, f);
  }
}

}  // namespace

void run_reduce_accuracy_suite(const BenchContext& ctx) {
  measure_world(ctx);
  simulate_rings(ctx);
}

}  // namespace mp::bench

// bench/comm_bench.cc: the `comm` suite. For each size S (bytes of the
// per-rank fp32 input; N = S / 4 elements) it times our MpiCommunicator
// against the raw MPI call on the same buffers, interleaved (bench/timing.h):
//
//   case                              ours                         ref
//   reduce_scatter_fp32_S             reduce_scatter fp32          MPI_Reduce_scatter_block
//   all_gather_fp32_S                 all_gather fp32 (N per rank) MPI_Allgather
//   all_reduce_fp32_S                 all_reduce fp32              MPI_Allreduce
//   all_reduce_bf16_S                 all_reduce bf16 wire         MPI_Allreduce fp32, N elements
//   reduce_scatter_bf16_acc_fp32_S    reduce_scatter bf16 -> fp32  MPI_Reduce_scatter_block fp32
//                                     (ReduceAccumulate::kFp32)
//   hook_bf16_all_reduce_S            the bf16 compression hook:   our fp32 all_reduce (avg)
//                                     cast to bf16, all_reduce,
//                                     cast back / size
//
// The `comm_gloo` suite times the Gloo backend (comm/gloo/; its ranks meet
// through a file store in a directory rank 0 makes) against the MPI backend
// on the same buffers (default sizes 16M and 64M), the reduce-scatter and
// all-gather in fp32, the all-reduce in fp32 and the bf16 reduce-scatter
// accumulating in fp32: ours = GlooCommunicator, ref = MpiCommunicator; the
// target is at least 0.9 of MPI's bus bandwidth (ratio <= 1/0.9).
//
// The hook line also times the bf16 all_reduce alone ("wire_only_ms") and
// the hook's two casts alone ("casts_ms"), so a missed target can be placed.
// Every contender's result is checked once after timing on data whose answer
// is exact (small integers), and all ranks agree on the verdict.
//
// Bandwidth as nccl-tests defines it: algbw = bytes / time, with bytes the
// full buffer (reduce_scatter: the input, all_gather: the output,
// all_reduce: the buffer) in the contender's own dtype (the hook line counts
// the fp32 gradient, so its algbw is the effective one); busbw = algbw *
// (n-1)/n for reduce_scatter and all_gather, * 2(n-1)/n for all_reduce.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/suites.h"
#include "bench/timing.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_error.h"
#include "core/error.h"
#include "kernels/convert.h"

namespace mp::bench {
namespace {

constexpr int64_t kDefaultSizesBytes[] = {int64_t{64} << 10, int64_t{256} << 10, int64_t{1} << 20,
                                          int64_t{4} << 20,  int64_t{16} << 20,  int64_t{64} << 20};
// The targets.
constexpr int64_t kParityFromBytes = int64_t{16} << 20;  // fp32 RS and AG within 10% of MPI
constexpr double kParityMaxRatio = 1.10;
constexpr int64_t kHookTargetBytes = int64_t{64} << 20;  // bf16 hook >= 1.6x fp32
constexpr double kHookMinSpeedup = 1.6;
constexpr int64_t kGlooSizesBytes[] = {int64_t{16} << 20, int64_t{64} << 20};
constexpr double kGlooMaxRatio = 1 / 0.9;  // Gloo's busbw >= 0.9 of MPI's

// Small integers in [-8, 8]: every sum over up to 16 ranks is exact in bf16
// and fp32 whatever the order, so results are compared for equality.
double test_value(int rank, int64_t i) { return static_cast<double>((i * 7 + rank * 3) % 17 - 8); }

// A duplicate of MPI_COMM_WORLD for the reference calls and the barriers.
class DupComm {
 public:
  DupComm() {
    MP_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    MP_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  }
  ~DupComm() { MPI_Comm_free(&comm_); }
  DupComm(const DupComm&) = delete;
  DupComm& operator=(const DupComm&) = delete;
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// One timed operation, as reported.
struct Side {
  std::string name;     // "mp_reduce_scatter", "mpi_reduce_scatter_block", ...
  DType dtype = DType::kF32;
  int64_t bytes = 0;    // nccl-tests bytes, for algbw
  std::function<void()> run;
  Tensor output;        // poisoned before the check run
  std::function<double(int64_t)> expected;  // element i of output
};

struct Case {
  std::string name;       // "reduce_scatter_fp32_16M"
  std::string op;         // "reduce_scatter", "all_gather", "all_reduce"
  int64_t size_bytes = 0;
  int64_t elements = 0;   // per-rank input elements
  Side ours, ref;
  std::optional<Side> wire_only;  // hook case: the bf16 all_reduce alone
  std::function<void()> casts_only;  // hook case: its two casts, no communication
  bool hook = false;
};

Case make_case(std::string name, std::string op, int64_t size_bytes, int64_t elements) {
  Case c;
  c.name = std::move(name);
  c.op = std::move(op);
  c.size_bytes = size_bytes;
  c.elements = elements;
  return c;
}

double bus_factor(const std::string& op, int n) {
  if (n <= 1) return 0.0;
  const double f = static_cast<double>(n - 1) / n;
  return op == "all_reduce" ? 2.0 * f : f;
}

// Empty when `out` equals expected(i) everywhere, else the first mismatch.
std::string check_output(const Tensor& out, const std::function<double(int64_t)>& expected,
                         Allocator& alloc) {
  Tensor wide = out;
  if (out.dtype() != DType::kF32) {
    wide = Tensor::empty(alloc, DType::kF32, {out.numel()}, MemCategory::kOther);
    convert(out, wide);
  }
  const float* got = wide.data_as<float>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    const float want = static_cast<float>(expected(i));
    if (!(got[i] == want)) {
      std::ostringstream os;
      os << dtype_name(out.dtype()) << " element " << i << " of " << out.numel() << ": got " << got[i]
         << ", expected " << want;
      return os.str();
    }
  }
  return {};
}

// Every rank learns every rank's verdict; all throw the same CommError.
void agree_on_check(MPI_Comm comm, const std::string& what, const std::string& mine) {
  constexpr int kLen = 256;
  int size = 1;
  MP_CHECK_MPI(MPI_Comm_size(comm, &size));
  std::vector<char> buf(kLen, '\0');
  std::memcpy(buf.data(), mine.data(), std::min<size_t>(mine.size(), kLen - 1));
  std::vector<char> all(static_cast<size_t>(kLen) * static_cast<size_t>(size));
  MP_CHECK_MPI(MPI_Allgather(buf.data(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm));
  std::string failures;
  for (int r = 0; r < size; ++r) {
    const char* text = &all[static_cast<size_t>(r) * kLen];
    if (*text) failures += detail::str(failures.empty() ? "" : "; ", "rank ", r, ": ", text);
  }
  if (!failures.empty()) MP_THROW(CommError, what, " gave a wrong result: ", failures);
}

void poison(const Tensor& t) { std::memset(t.data(), 0xFF, t.size_bytes()); }  // NaN in fp32 and bf16

class CommSuite {
 public:
  explicit CommSuite(const BenchContext& ctx)
      : ctx_(ctx),
        rank_(ctx.world.rank()),
        n_(ctx.world.size()),
        comm_(MpiCommunicator::create_world("bench", CommOptions{})) {}

  // comm_gloo: the Gloo backend against comm_.
  void run_gloo() {
    gloo_ = gloo_bench_world("bench");
    std::vector<int64_t> sizes = ctx_.options.sizes_bytes;
    if (sizes.empty()) sizes.assign(std::begin(kGlooSizesBytes), std::end(kGlooSizesBytes));
    ctx_.reporter.note(detail::str("comm_gloo: ", n_, " rank(s), Gloo against the MPI backend, ",
                                   ctx_.options.iters, " timed iterations after ", ctx_.options.warmup,
                                   " warm-up, median of the slowest rank"));
    for (int64_t s : sizes) {
      for (const char* op : {"reduce_scatter_fp32", "all_gather_fp32", "all_reduce_fp32",
                             "reduce_scatter_bf16_acc_fp32"}) {
        measure(backend_case(op, s));
      }
    }
    summarize_targets();
  }

  void run() {
    const auto& o = ctx_.options;
    std::vector<int64_t> sizes = o.sizes_bytes;
    if (sizes.empty()) sizes.assign(std::begin(kDefaultSizesBytes), std::end(kDefaultSizesBytes));
    for (int64_t s : sizes) {
      if (s < 4 * static_cast<int64_t>(n_)) {
        MP_THROW(ConfigError, "comm: size ", s, " bytes is below one fp32 element per rank (",
                 4 * n_, " bytes at ", n_, " ranks)");
      }
      if (s / 4 > INT_MAX) {
        MP_THROW(ConfigError, "comm: size ", s, " bytes exceeds the raw MPI calls' int count (",
                 INT_MAX, " fp32 elements)");
      }
    }
    ctx_.reporter.note(detail::str("comm: ", n_, " rank(s), ", o.iters, " timed iterations after ",
                                   o.warmup, " warm-up, median of the slowest rank; sizes are bytes "
                                   "of the per-rank fp32 input"));
    for (int64_t s : sizes) {
      measure(reduce_scatter_case(s, false));
      measure(all_gather_case(s));
      measure(all_reduce_case(s));
      measure(all_reduce_bf16_case(s));
      measure(reduce_scatter_case(s, true));
      measure(hook_case(s));
    }
    summarize_targets();
  }

 private:
  Tensor tensor(DType t, int64_t n) { return Tensor::empty(alloc_, t, {n}, MemCategory::kOther); }

  // fp32 (or, through a cast, bf16) input holding test_value(rank, i).
  Tensor input(DType t, int64_t n) {
    Tensor f32 = tensor(DType::kF32, n);
    float* p = f32.data_as<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(test_value(rank_, i));
    if (t == DType::kF32) return f32;
    Tensor narrow = tensor(t, n);
    convert(f32, narrow);
    return narrow;
  }

  double sum_over_ranks(int64_t i) const {
    double s = 0;
    for (int r = 0; r < n_; ++r) s += test_value(r, i);
    return s;
  }

  std::string label(const char* stem, int64_t size_bytes) const {
    return std::string(stem) + "_" + size_label(size_bytes);
  }

  // comm_gloo's case `op`: the same collective on gloo_ (ours) and comm_.
  Case backend_case(const std::string& op, int64_t s) {
    const bool rs = op.rfind("reduce_scatter", 0) == 0, ag = op == "all_gather_fp32";
    const bool bf16 = op == "reduce_scatter_bf16_acc_fp32";
    const int64_t count = rs ? s / 4 / n_ * n_ : s / 4, out_count = rs ? count / n_ : ag ? count * n_ : count;
    Case c = make_case(label(op.c_str(), s), rs ? "reduce_scatter" : ag ? "all_gather" : "all_reduce", s, count);
    Tensor in = input(bf16 ? DType::kBF16 : DType::kF32, count);
    ReduceOptions ro;
    if (bf16) ro.accumulate = ReduceAccumulate::kFp32;
    const int64_t shard = count / n_;
    std::function<double(int64_t)> expected = [this, rs, ag, shard, count](int64_t i) {
      return rs ? sum_over_ranks(rank_ * shard + i) : ag ? test_value(static_cast<int>(i / count), i % count)
                                                          : sum_over_ranks(i);
    };
    auto side = [&](const char* name, Communicator* comm) {
      Tensor out = tensor(DType::kF32, out_count);
      const int64_t bytes = (rs ? count : out_count) * (bf16 ? 2 : 4);
      return Side{name, bf16 ? DType::kBF16 : DType::kF32, bytes,
                  [=] {
                    (rs ? comm->reduce_scatter(in, out, ro) : ag ? comm->all_gather(in, out)
                                                                 : comm->all_reduce(in, out, ro))
                        ->wait();
                  },
                  out, expected};
    };
    c.ours = side("gloo", gloo_.get());
    c.ref = side("mpi", comm_.get());
    return c;
  }

  Case reduce_scatter_case(int64_t s, bool bf16_acc_fp32) {
    const int64_t shard = s / 4 / n_;
    const int64_t count = shard * n_;
    Case c = make_case(label(bf16_acc_fp32 ? "reduce_scatter_bf16_acc_fp32" : "reduce_scatter_fp32", s),
                       "reduce_scatter", s, count);
    Tensor in32 = input(DType::kF32, count);
    Tensor out32 = tensor(DType::kF32, shard);
    const MPI_Comm ref_comm = ref_.get();
    auto expected = [this, shard](int64_t j) { return sum_over_ranks(rank_ * shard + j); };
    c.ref = {bf16_acc_fp32 ? "mpi_reduce_scatter_block_fp32" : "mpi_reduce_scatter_block",
             DType::kF32, count * 4,
             [=] {
               MP_CHECK_MPI(MPI_Reduce_scatter_block(in32.data(), out32.data(), static_cast<int>(shard),
                                                     MPI_FLOAT, MPI_SUM, ref_comm));
             },
             out32, expected};
    if (!bf16_acc_fp32) {
      c.ours = {"mp_reduce_scatter", DType::kF32, count * 4,
                [this, in32, out32] { comm_->reduce_scatter(in32, out32, {})->wait(); }, out32, expected};
    } else {
      Tensor in16 = input(DType::kBF16, count);
      Tensor out_acc = tensor(DType::kF32, shard);
      ReduceOptions ro;
      ro.accumulate = ReduceAccumulate::kFp32;
      c.ours = {"mp_reduce_scatter_bf16_acc_fp32", DType::kBF16, count * 2,
                [this, in16, out_acc, ro] { comm_->reduce_scatter(in16, out_acc, ro)->wait(); }, out_acc,
                expected};
    }
    return c;
  }

  Case all_gather_case(int64_t s) {
    const int64_t count = s / 4;
    Case c = make_case(label("all_gather_fp32", s), "all_gather", s, count);
    Tensor in = input(DType::kF32, count);
    Tensor out = tensor(DType::kF32, count * n_);
    const MPI_Comm ref_comm = ref_.get();
    auto expected = [count](int64_t i) { return test_value(static_cast<int>(i / count), i % count); };
    c.ours = {"mp_all_gather", DType::kF32, count * n_ * 4,
              [this, in, out] { comm_->all_gather(in, out)->wait(); }, out, expected};
    c.ref = {"mpi_allgather", DType::kF32, count * n_ * 4,
             [=] {
               MP_CHECK_MPI(MPI_Allgather(in.data(), static_cast<int>(count), MPI_FLOAT, out.data(),
                                          static_cast<int>(count), MPI_FLOAT, ref_comm));
             },
             out, expected};
    return c;
  }

  Side mpi_allreduce_fp32(const char* name, const Tensor& in, const Tensor& out) {
    const MPI_Comm ref_comm = ref_.get();
    return {name, DType::kF32, in.numel() * 4,
            [=] {
              MP_CHECK_MPI(MPI_Allreduce(in.data(), out.data(), static_cast<int>(in.numel()), MPI_FLOAT,
                                         MPI_SUM, ref_comm));
            },
            out, [this](int64_t i) { return sum_over_ranks(i); }};
  }

  Case all_reduce_case(int64_t s) {
    const int64_t count = s / 4;
    Case c = make_case(label("all_reduce_fp32", s), "all_reduce", s, count);
    Tensor in = input(DType::kF32, count);
    Tensor out = tensor(DType::kF32, count);
    c.ours = {"mp_all_reduce", DType::kF32, count * 4,
              [this, in, out] { comm_->all_reduce(in, out, {})->wait(); }, out,
              [this](int64_t i) { return sum_over_ranks(i); }};
    c.ref = mpi_allreduce_fp32("mpi_allreduce", in, out);
    return c;
  }

  Side bf16_all_reduce(int64_t count) {
    Tensor in = input(DType::kBF16, count);
    Tensor out = tensor(DType::kBF16, count);
    return {"mp_all_reduce_bf16", DType::kBF16, count * 2,
            [this, in, out] { comm_->all_reduce(in, out, {})->wait(); }, out,
            [this](int64_t i) { return sum_over_ranks(i); }};
  }

  Case all_reduce_bf16_case(int64_t s) {
    const int64_t count = s / 4;
    Case c = make_case(label("all_reduce_bf16", s), "all_reduce", s, count);
    c.ours = bf16_all_reduce(count);
    c.ref = mpi_allreduce_fp32("mpi_allreduce_fp32", input(DType::kF32, count),
                               tensor(DType::kF32, count));
    return c;
  }

  // Note [bf16 compression hook]: what a DDP hook that sends bf16 does with
  // an fp32 gradient: cast to bf16 on the communicator's stream, all_reduce
  // the bf16 buffer in place (sum), cast back dividing by size() (the
  // average). The reference is the plain fp32 all_reduce with kAvg.
  Case hook_case(int64_t s) {
    const int64_t count = s / 4;
    Case c = make_case(label("hook_bf16_all_reduce", s), "all_reduce", s, count);
    c.hook = true;
    Tensor grad = input(DType::kF32, count);
    Tensor wire = tensor(DType::kBF16, count);
    Tensor reduced = tensor(DType::kF32, count);
    const double n = n_;
    auto avg = [this, n](int64_t i) { return sum_over_ranks(i) / n; };
    c.ours = {"mp_bf16_hook_all_reduce", DType::kF32, count * 4,
              [this, grad, wire, reduced, n] {
                Stream& stream = comm_->stream();
                convert(grad, wire, {}, &stream);
                comm_->all_reduce(wire, wire, {});
                ConvertOptions back;
                back.divisor = n;
                convert(wire, reduced, back, &stream);
                comm_->fence("bf16 hook")->wait();
              },
              reduced, avg};
    ReduceOptions avg_op;
    avg_op.op = ReduceOp::kAvg;
    c.ref = {"mp_all_reduce_fp32_avg", DType::kF32, count * 4,
             [this, grad, reduced, avg_op] { comm_->all_reduce(grad, reduced, avg_op)->wait(); }, reduced,
             avg};
    c.wire_only = bf16_all_reduce(count);
    c.casts_only = [this, grad, wire, reduced, n] {
      Stream& stream = comm_->stream();
      convert(grad, wire, {}, &stream);
      ConvertOptions back;
      back.divisor = n;
      convert(wire, reduced, back, &stream);
      comm_->fence("bf16 hook casts")->wait();
    };
    return c;
  }

  void measure(Case c) {
    std::vector<Contender> contenders = {{c.ours.name, c.ours.run}, {c.ref.name, c.ref.run}};
    if (c.wire_only) contenders.push_back({c.wire_only->name, c.wire_only->run});
    if (c.casts_only) contenders.push_back({"mp_bf16_hook_casts", c.casts_only});
    const std::vector<Timing> t =
        time_interleaved(ref_.get(), contenders, ctx_.options.warmup, ctx_.options.iters);
    verify(c.name, c.ours);
    verify(c.name, c.ref);
    if (c.wire_only) verify(c.name, *c.wire_only);
    report(c, t);
  }

  void verify(const std::string& case_name, const Side& side) {
    poison(side.output);
    MP_CHECK_MPI(MPI_Barrier(ref_.get()));
    side.run();
    agree_on_check(ref_.get(), case_name + " (" + side.name + ")",
                   check_output(side.output, side.expected, alloc_));
  }

  void report(const Case& c, const std::vector<Timing>& t) {
    const double ours_s = t[0].median_s, ref_s = t[1].median_s;
    if (rank_ != 0) return;  // only rank 0 has the timings
    const double ratio = ours_s / ref_s;
    const double bus = bus_factor(c.op, n_);
    const double algbw = static_cast<double>(c.ours.bytes) / ours_s / 1e9;
    const double ref_algbw = static_cast<double>(c.ref.bytes) / ref_s / 1e9;
    nlohmann::ordered_json j;
    j["case"] = c.name;
    j["value"] = round_to(ours_s * 1e3, 4);
    j["unit"] = "ms";
    j["ref"] = c.ref.name;
    j["ref_value"] = round_to(ref_s * 1e3, 4);
    j["ratio"] = round_to(ratio, 4);
    j["better"] = "lower";
    j["ours"] = c.ours.name;
    j["op"] = c.op;
    j["dtype"] = dtype_name(c.ours.dtype);
    j["ref_dtype"] = dtype_name(c.ref.dtype);
    j["size_bytes"] = c.size_bytes;
    j["elements"] = c.elements;
    j["bytes"] = c.ours.bytes;
    j["ref_bytes"] = c.ref.bytes;
    j["algbw_GBps"] = round_to(algbw, 3);
    j["busbw_GBps"] = round_to(algbw * bus, 3);
    j["ref_algbw_GBps"] = round_to(ref_algbw, 3);
    j["ref_busbw_GBps"] = round_to(ref_algbw * bus, 3);
    j["min_ms"] = round_to(t[0].min_s * 1e3, 4);
    j["ref_min_ms"] = round_to(t[1].min_s * 1e3, 4);
    j["page_faults"] = round_to(t[0].median_page_faults, 1);
    j["ref_page_faults"] = round_to(t[1].median_page_faults, 1);
    std::string human = detail::str(c.name, ": ", c.ours.name, " ", j["value"].get<double>(), " ms vs ",
                                     c.ref.name, " ", j["ref_value"].get<double>(), " ms, ratio ",
                                     j["ratio"].get<double>(), " (lower is better), busbw ",
                                     j["busbw_GBps"].get<double>(), " vs ",
                                     j["ref_busbw_GBps"].get<double>(), " GB/s, page faults per call ",
                                     j["page_faults"].get<double>(), " vs ", j["ref_page_faults"].get<double>());
    if (c.hook) {
      const double wire_s = t[2].median_s;
      j["speedup"] = round_to(ref_s / ours_s, 3);
      j["wire_only_ms"] = round_to(wire_s * 1e3, 4);
      j["wire_only_speedup"] = round_to(ref_s / wire_s, 3);
      j["casts_ms"] = round_to(t[3].median_s * 1e3, 4);
      human += detail::str(", speedup ", j["speedup"].get<double>(), "x (bf16 all_reduce alone ",
                           j["wire_only_speedup"].get<double>(), "x; the casts alone ",
                           j["casts_ms"].get<double>(), " ms)");
      if (c.size_bytes == kHookTargetBytes) {
        const bool met = ref_s / ours_s >= kHookMinSpeedup;
        const bool wire_met = ref_s / wire_s >= kHookMinSpeedup;
        j["target"] = detail::str("speedup >= ", kHookMinSpeedup);
        j["target_met"] = met;
        j["wire_only_target_met"] = wire_met;
        targets_.push_back(detail::str(c.name, ": bf16 hook ", j["speedup"].get<double>(),
                                       "x faster than fp32 all_reduce (target >= ", kHookMinSpeedup,
                                       "x): ", met ? "met" : "NOT met", "; bf16 all_reduce alone ",
                                       j["wire_only_speedup"].get<double>(), "x: ",
                                       wire_met ? "met" : "NOT met"));
      }
    }
    const bool parity_case = c.name.rfind("reduce_scatter_fp32", 0) == 0 ||
                             c.name.rfind("all_gather_fp32", 0) == 0;
    if (gloo_) {
      const bool met = ratio <= kGlooMaxRatio;
      j["busbw_ratio"] = round_to(ref_s / ours_s, 4);
      j["target"] = "Gloo's busbw >= 0.9 of MPI's";
      j["target_met"] = met;
      targets_.push_back(detail::str(c.name, ": Gloo at ", j["busbw_ratio"].get<double>(),
                                     " of MPI's bus bandwidth (target >= 0.9): ", met ? "met" : "NOT met"));
    } else if (parity_case && c.size_bytes >= kParityFromBytes) {
      const bool met = ratio <= kParityMaxRatio;
      j["target"] = detail::str("ratio <= ", kParityMaxRatio);
      j["target_met"] = met;
      targets_.push_back(detail::str(c.name, ": ratio ", j["ratio"].get<double>(), " (target <= ",
                                     kParityMaxRatio, "): ", met ? "met" : "NOT met"));
    }
    j["ranks"] = n_;
    j["iters"] = ctx_.options.iters;
    j["warmup"] = ctx_.options.warmup;
    ctx_.reporter.emit(j);
    ctx_.reporter.note(human);
  }

  void summarize_targets() const {
    if (targets_.empty()) return;
    ctx_.reporter.note("targets:");
    for (const std::string& t : targets_) ctx_.reporter.note("  " + t);
  }

  const BenchContext& ctx_;
  int rank_;
  int n_;
  Allocator alloc_;
  DupComm ref_;
  std::unique_ptr<MpiCommunicator> comm_;
  std::unique_ptr<Communicator> gloo_;  // comm_gloo only
  std::vector<std::string> targets_;  // rank 0's verdicts, for the summary
};

}  // namespace

void run_comm_suite(const BenchContext& ctx) { CommSuite(ctx).run(); }
void run_comm_gloo_suite(const BenchContext& ctx) { CommSuite(ctx).run_gloo(); }

}  // namespace mp::bench

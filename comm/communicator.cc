#include "comm/communicator.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <sstream>

#include "comm/backend_util.h"
#include "core/error.h"

namespace mp {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  MP_THROW(EnforceError, "invalid ReduceOp ", static_cast<int>(op));
}

namespace comm_detail {

math::ElementOp element_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return math::ElementOp::kSum;
    case ReduceOp::kMax: return math::ElementOp::kMax;
    case ReduceOp::kMin: return math::ElementOp::kMin;
  }
  MP_THROW(EnforceError, "invalid ReduceOp ", static_cast<int>(op));
}

double reduction_divisor(const ReduceOptions& o, int size) {
  MP_ENFORCE(o.divide_factor > 0, "divide_factor must be positive, got ", o.divide_factor);
  return (o.op == ReduceOp::kAvg ? size : 1) * o.divide_factor;
}

void check_reducible(DType t) {
  if (is_fp8(t)) MP_THROW(ConfigError, "reductions on ", dtype_name(t), " are not supported");
}

// Fingerprints carry an op as its index here.
constexpr const char* kFingerprintOps[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",   "all_to_all",
                                           "barrier",    "split",          "host_all_gather", "all_to_all_v"};
constexpr int64_t kNumFingerprintOps = 9;

std::array<int64_t, 4> fingerprint(const CollectiveInfo& info) {
  int64_t op = 0;
  while (op < kNumFingerprintOps && info.op != kFingerprintOps[op]) ++op;  // kNumFingerprintOps: "other"
  return {op, static_cast<int64_t>(info.dtype), info.count, static_cast<int64_t>(info.sequence)};
}

void check_fingerprints(const std::array<int64_t, 4>& mine, const std::vector<int64_t>& all,
                        const std::string& communicator, uint64_t sequence) {
  const size_t ranks = all.size() / 4;
  bool same = true;
  for (size_t r = 0; r < ranks; ++r) same = same && std::equal(mine.begin(), mine.end(), &all[4 * r]);
  if (same) return;
  std::ostringstream os;
  for (size_t r = 0; r < ranks; ++r) {
    const int64_t* f = &all[4 * r];
    os << (r ? "; " : "") << "rank " << r << ": "
       << (f[0] >= 0 && f[0] < kNumFingerprintOps ? kFingerprintOps[f[0]] : "other") << " #" << f[3] << " ("
       << dtype_name(static_cast<DType>(f[1])) << " x " << f[2] << ")";
  }
  MP_THROW(CommError, "collective mismatch on communicator '", communicator, "' at #", sequence,
           ": the ranks called different collectives: ", os.str());
}

}  // namespace comm_detail

using comm_detail::check_reducible;
using comm_detail::element_ptr;
using comm_detail::reduction_divisor;

// ---- data plane: every argument rule, once ----------------------------------------

void Communicator::check_tensor(const Tensor& t, const char* what) const {
  MP_ENFORCE(t.defined(), what, " is undefined");
  MP_ENFORCE(t.device() == device(), "the communicator '", name(), "' on ", device(),
             " needs tensors on that device; ", what, " is ", t.describe());
}

void Communicator::note_issued(const char* op, const Tensor& t) {
  static std::atomic<uint64_t> order{0};
  last_ = Issued{op, t.numel(), t.dtype(), last_.number + 1, order.fetch_add(1, std::memory_order_relaxed) + 1};
}

std::string Communicator::last_issued() const {
  if (last_.op == nullptr) return std::string();
  return detail::str(last_.op, " of ", last_.count, " ", dtype_name(last_.dtype), " (data-plane collective ",
                     last_.number, " of '", name_, "')");
}

WorkPtr Communicator::all_gather(const Tensor& input, const Tensor& output) {
  check_tensor(input, "all_gather input");
  check_tensor(output, "all_gather output");
  MP_ENFORCE(input.dtype() == output.dtype(), "all_gather from ", input.describe(), " to ", output.describe());
  const int64_t n = input.numel();
  MP_ENFORCE_EQ(output.numel(), n * size(), "all_gather output must hold size() x input elements");
  const bool in_place = n > 0 && input.data() == element_ptr(output, rank() * n);
  note_issued("all_gather", input);
  return do_all_gather(input, output, in_place);
}

WorkPtr Communicator::reduce_scatter(const Tensor& input, const Tensor& output, const ReduceOptions& o) {
  check_tensor(input, "reduce_scatter input");
  check_tensor(output, "reduce_scatter output");
  check_reducible(input.dtype());
  const int64_t n = output.numel();
  MP_ENFORCE_EQ(input.numel(), n * size(), "reduce_scatter input must hold size() x output elements");
  reduction_divisor(o, size());  // validates divide_factor
  const bool in_place = n > 0 && output.data() == element_ptr(input, rank() * n);
  if (o.accumulate == ReduceAccumulate::kFp32) {
    MP_ENFORCE(!in_place || output.dtype() == input.dtype(),
               "in-place reduce_scatter needs equal input and output dtypes");
  } else {
    MP_ENFORCE(input.dtype() == output.dtype(), "reduce_scatter (wire accumulation) from ",
               input.describe(), " to ", output.describe(), ": dtypes must be equal");
  }
  note_issued("reduce_scatter", input);
  return do_reduce_scatter(input, output, o, in_place);
}

WorkPtr Communicator::all_reduce(const Tensor& input, const Tensor& output, const ReduceOptions& o) {
  check_tensor(input, "all_reduce input");
  check_tensor(output, "all_reduce output");
  check_reducible(input.dtype());
  MP_ENFORCE_EQ(input.numel(), output.numel(), "all_reduce input and output element counts");
  reduction_divisor(o, size());  // validates divide_factor
  const bool in_place = input.numel() > 0 && input.data() == output.data();
  if (o.accumulate == ReduceAccumulate::kWire) {
    MP_ENFORCE(input.dtype() == output.dtype(), "all_reduce (wire accumulation) from ",
               input.describe(), " to ", output.describe(), ": dtypes must be equal");
  } else {
    MP_ENFORCE(!in_place || input.dtype() == output.dtype(),
               "in-place all_reduce needs equal input and output dtypes");
  }
  note_issued("all_reduce", input);
  return do_all_reduce(input, output, o, in_place);
}

WorkPtr Communicator::broadcast(const Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast tensor");
  MP_ENFORCE(root >= 0 && root < size(), "broadcast root ", root, " outside [0, ", size(), ")");
  note_issued("broadcast", tensor);
  return do_broadcast(tensor, root);
}

WorkPtr Communicator::all_to_all(const Tensor& input, const Tensor& output) {
  check_tensor(input, "all_to_all input");
  check_tensor(output, "all_to_all output");
  MP_ENFORCE(input.dtype() == output.dtype(), "all_to_all from ", input.describe(), " to ", output.describe());
  MP_ENFORCE_EQ(input.numel(), output.numel(), "all_to_all input and output element counts");
  MP_ENFORCE_EQ(input.numel() % size(), 0, "all_to_all needs size() equal chunks");
  const bool in_place = input.numel() > 0 && input.data() == output.data();
  note_issued("all_to_all", input);
  return do_all_to_all(input, output, in_place);
}

WorkPtr Communicator::all_to_all_v(const Tensor& input, std::span<const int64_t> send_counts, const Tensor& output,
                                   std::span<const int64_t> recv_counts) {
  check_tensor(input, "all_to_all_v input");
  check_tensor(output, "all_to_all_v output");
  MP_ENFORCE(input.dtype() == output.dtype(), "all_to_all_v from ", input.describe(), " to ", output.describe());
  MP_ENFORCE_EQ(static_cast<int>(send_counts.size()), size(), "all_to_all_v send counts (one per rank)");
  MP_ENFORCE_EQ(static_cast<int>(recv_counts.size()), size(), "all_to_all_v receive counts (one per rank)");
  auto total = [](std::span<const int64_t> counts, const char* what) {
    int64_t sum = 0;
    for (const int64_t c : counts) {
      MP_ENFORCE_GE(c, 0, "all_to_all_v ", what, " count");
      sum += c;
    }
    return sum;
  };
  const int64_t sent = total(send_counts, "send"), received = total(recv_counts, "receive");
  MP_ENFORCE_LE(sent, input.numel(), "all_to_all_v sends more elements than its input holds");
  MP_ENFORCE_LE(received, output.numel(), "all_to_all_v receives more elements than its output holds");
  MP_ENFORCE(sent == 0 || received == 0 || input.data() != output.data(), "all_to_all_v is never in place");
  note_issued("all_to_all_v", input);
  return do_all_to_all_v(input, {send_counts.begin(), send_counts.end()}, output,
                         {recv_counts.begin(), recv_counts.end()});
}

// ---- control plane (Note [Control plane]) -----------------------------------------

std::vector<std::string> Communicator::all_gather_bytes(std::string_view mine) {
  const int64_t my_length = static_cast<int64_t>(mine.size());
  const std::vector<int64_t> lengths = all_gather_int64(std::span<const int64_t>(&my_length, 1));
  const size_t longest = static_cast<size_t>(*std::max_element(lengths.begin(), lengths.end()));
  std::vector<std::string> out(lengths.size());
  if (longest == 0) return out;
  std::string padded(mine);
  padded.resize(longest, '\0');
  std::string all(longest * lengths.size(), '\0');
  do_host_all_gather(padded.data(), longest, all.data());
  for (size_t r = 0; r < out.size(); ++r) out[r] = all.substr(r * longest, static_cast<size_t>(lengths[r]));
  return out;
}

std::string Communicator::broadcast_bytes(std::string_view mine, int root) {
  MP_ENFORCE(root >= 0 && root < size(), "broadcast_bytes root ", root, " outside [0, ", size(), ")");
  // Only the root's bytes travel: the others send nothing.
  std::vector<std::string> all = all_gather_bytes(rank() == root ? mine : std::string_view());
  return std::move(all[static_cast<size_t>(root)]);
}

namespace {

template <class T>
T reduce_in_rank_order(const std::vector<T>& all, HostOp op) {
  T acc = all.front();
  for (size_t r = 1; r < all.size(); ++r) {
    switch (op) {
      case HostOp::kSum: acc = acc + all[r]; break;
      case HostOp::kMin: acc = std::min(acc, all[r]); break;
      case HostOp::kMax: acc = std::max(acc, all[r]); break;
    }
  }
  return acc;
}

// A failure on one rank as a string: its tier as a digit, then the message.
// An IoError, an EnforceError (a bug) or any other exception arrives as
// IoError: a file system, or a bug, on that rank.
std::string describe_failure(std::exception_ptr e) {
  const auto tagged = [](ErrorTier t, const char* what) {
    return static_cast<char>('0' + static_cast<int>(t)) + std::string(what);
  };
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return tagged(x.tier() == ErrorTier::kEnforce ? ErrorTier::kIo : x.tier(), x.what());
  } catch (const std::bad_alloc&) {
    return tagged(ErrorTier::kOutOfMemory, "out of memory");
  } catch (const std::exception& x) {
    return tagged(ErrorTier::kIo, x.what());
  } catch (...) {
    return tagged(ErrorTier::kIo, "unknown exception");
  }
}

}  // namespace

std::vector<int64_t> Communicator::all_gather_int64(std::span<const int64_t> mine) {
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(size()));
  if (!mine.empty()) do_host_all_gather(mine.data(), mine.size_bytes(), all.data());
  return all;
}

std::vector<double> Communicator::all_gather_double(std::span<const double> mine) {
  std::vector<double> all(mine.size() * static_cast<size_t>(size()));
  if (!mine.empty()) do_host_all_gather(mine.data(), mine.size_bytes(), all.data());
  return all;
}

int64_t Communicator::all_reduce_int64(int64_t mine, HostOp op) {
  return reduce_in_rank_order(all_gather_int64(std::span<const int64_t>(&mine, 1)), op);
}

double Communicator::all_reduce_double(double mine, HostOp op) {
  // NaN propagates through kMin/kMax as through the sum: std::min/max keep
  // the first argument on unordered comparisons, so check explicitly.
  const std::vector<double> all = all_gather_double(std::span<const double>(&mine, 1));
  if (op != HostOp::kSum) {
    for (double v : all) {
      if (v != v) return v;
    }
  }
  return reduce_in_rank_order(all, op);
}

void Communicator::agree(std::string_view what, const std::function<void()>& body) {
  std::exception_ptr local;
  try {
    body();
  } catch (...) {
    local = std::current_exception();
  }
  const std::vector<std::string> all = all_gather_bytes(local ? describe_failure(local) : std::string());
  if (local) {
    try {
      std::rethrow_exception(local);
    } catch (Error& x) {
      x.set_agreed();
      throw;
    }
  }
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    throw_error(static_cast<ErrorTier>(all[r][0] - '0'), __FILE__, __LINE__,
                detail::str(what, " failed on rank ", r, ": ", all[r].substr(1)), /*agreed=*/true);
  }
}

}  // namespace mp

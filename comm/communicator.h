// comm/communicator.h: the one interface through which the runtime
// communicates. Backends: comm/mpi (CPU memory, MPI) and comm/nccl (CUDA
// memory, NCCL). Algorithms and the engine include only this header.
//
// Contracts
// - Counts are element counts of typed tensors, never bytes. Any count works,
//   zero included.
// - all_gather: output.numel() == size() * input.numel(); rank r's input
//   lands at output[r * n, (r+1) * n). In place when input is exactly that
//   slice of output.
// - reduce_scatter: input.numel() == size() * output.numel(); rank r gets
//   the reduction of every rank's input[r * n, (r+1) * n). In place when
//   output is exactly that slice of input; input contents are then undefined
//   afterwards.
// - all_reduce: output.numel() == input.numel(); in place when they alias.
// - broadcast: root's tensor is copied into every rank's tensor.
// - all_to_all: input and output have size() * n elements; chunk j of
//   rank i's input lands in chunk i of rank j's output.
// - all_to_all_v: chunks of any size, back to back in rank order: input
//   holds send_counts[j] elements for rank j, output gets recv_counts[i]
//   from rank i; rank i's send_counts[j] must equal rank j's
//   recv_counts[i]. Never in place.
// - dtypes: fp32, bf16, fp16 for every op; fp8 (e4m3, e5m2) for all_gather,
//   broadcast and all_to_all only. Reductions: sum, avg, max, min; max and
//   min propagate NaN. Input and output dtypes are equal, except that
//   reduce_accumulate kFp32 may write a wider output (e.g. bf16 in, fp32 out).
// - divide_factor: the result is divided by it (after the average's
//   division by size()). It is applied by us, in fp32, not by NCCL's
//   PREMUL_SUM.
// - Note [Reduce accumulation]: kWire reduces in the wire dtype, as NCCL's
//   rings do: a bf16 rounding at every hop, so the error grows with the world
//   size and depends on the order. kFp32 sends the wire dtype but
//   accumulates in fp64, in fixed rank order, and rounds once into the output.
//   It is an all-to-all of bounded chunks (CommOptions::accumulate_chunk_bytes
//   of scratch) plus a local sum, so it is deterministic and equals the
//   exactly rounded sum whenever the fp64 sum is exact (always for a few
//   bf16 or fp16 terms of similar magnitude). It is then also independent of
//   the order and the number of ranks holding the same contributions.
// - Every collective is issued in call order on stream() and returns a Work
//   (comm/work.h says what completion means). Collectives that are issued
//   must be issued in the same order on every rank; with
//   CommOptions::check_fingerprints a mismatch raises CommError on every rank
//   before the mismatched collective runs.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/work.h"
#include "core/host_wait.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace mp {

struct CommProgress;  // comm/peer_report.h

enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };
enum class ReduceAccumulate : uint8_t { kWire = 0, kFp32 = 1 };

std::string_view reduce_op_name(ReduceOp op);

// Reductions of the control plane's host values.
enum class HostOp : uint8_t { kSum = 0, kMin = 1, kMax = 2 };

struct ReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  double divide_factor = 1.0;
  ReduceAccumulate accumulate = ReduceAccumulate::kWire;
};

// Behaviour of a communicator; CommConfig in proto/mp.proto maps onto it.
struct CommOptions {
  // Every wait on a collective, and the host's waits on the device work of
  // whoever takes it (Note [Bounded host waits] in core/host_wait.h).
  std::chrono::milliseconds timeout{kDefaultWaitTimeout};
  // Compare every collective's (op, dtype, count, sequence) across ranks
  // before running it. Costs one small all-gather per collective.
  bool check_fingerprints = false;
  // Scratch of the kFp32 accumulation, all chunks together.
  size_t accumulate_chunk_bytes = size_t{4} << 20;
  // How long a timed-out rank waits for the others to say where they are.
  std::chrono::milliseconds diagnose_timeout{2000};
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;
  const std::string& name() const { return name_; }
  const CommOptions& options() const { return options_; }

  // Where this communicator's work runs (the communication thread or CUDA
  // stream). Local work submitted here (casts of a hook) is ordered with
  // the collectives.
  virtual Stream& stream() = 0;

  // ---- Data plane: tensors on device() ----------------------------------------
  WorkPtr all_gather(const Tensor& input, const Tensor& output);
  WorkPtr reduce_scatter(const Tensor& input, const Tensor& output, const ReduceOptions& options = {});
  WorkPtr all_reduce(const Tensor& input, const Tensor& output, const ReduceOptions& options = {});
  WorkPtr broadcast(const Tensor& tensor, int root);
  WorkPtr all_to_all(const Tensor& input, const Tensor& output);
  WorkPtr all_to_all_v(const Tensor& input, std::span<const int64_t> send_counts, const Tensor& output,
                       std::span<const int64_t> recv_counts);
  virtual WorkPtr barrier() = 0;
  // A Work that completes when everything issued so far on stream() has.
  virtual WorkPtr fence(const std::string& what) = 0;

  // The last data-plane collective issued here, e.g. "reduce_scatter of
  // 4718592 bf16 (data-plane collective 37 of 'world')"; empty before any.
  // Error reports name it (a device fault names where the rank was).
  std::string last_issued() const;
  // The process-wide issue order of that collective (0: none), to find the
  // latest among several communicators.
  uint64_t last_issued_order() const { return last_.order; }

  // Collective over this communicator: ranks with the same color form a new
  // communicator, ordered by (key, rank). A negative color gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // A communicator that runs its collectives elsewhere but its control plane
  // over this one (NCCL's) numbers them itself: this one's peer monitor
  // answers for `progress` while the returned Diagnose (or a copy) lives, and
  // it names the members not yet at a collective of that numbering. Called
  // at the same point on every member, as split. By default: none (empty).
  virtual Work::Diagnose watch(std::shared_ptr<CommProgress> /*progress*/) { return {}; }

  // ---- Control plane: small host values -----------------------------------------
  // Note [Control plane]
  // Step decisions, statistics, errors, fingerprints and checkpoint agreement
  // are small host values, whatever device() the tensors live on. These
  // calls are blocking and collective over every member, in issue order with
  // the collectives above (one sequence: fingerprints and timeouts cover them
  // too), and carry the values exactly, in rank order: an int64 as an int64,
  // a double as its 8 bytes, never encoded in floats. Every backend carries
  // them over host memory (MPI), so they work beside a GPU data plane.
  //
  // Every rank's bytes, in rank order (lengths may differ).
  std::vector<std::string> all_gather_bytes(std::string_view mine);
  // `root`'s bytes on every rank (the others' `mine` is ignored).
  std::string broadcast_bytes(std::string_view mine, int root);
  // Every rank's values, rank-major (rank r's at [r * k, (r+1) * k)); every
  // rank passes the same k (a different k is caught as a fingerprint
  // mismatch when CommOptions::check_fingerprints is on).
  std::vector<int64_t> all_gather_int64(std::span<const int64_t> mine);
  std::vector<double> all_gather_double(std::span<const double> mine);
  // The reduction over the ranks. Sums run in rank order, so every rank
  // gets the same bits (a double sum is then deterministic for a world size).
  int64_t all_reduce_int64(int64_t mine, HostOp op);
  double all_reduce_double(double mine, HostOp op);
  // Cross-rank error agreement: runs `body` on every rank; if it threw on any
  // rank, every rank throws, marked agreed (core/error.h): a rank whose body
  // threw rethrows its own error, the others the first failed rank's type
  // (ConfigError, ModelError, NumericError, CommError, CudaError and
  // OutOfMemoryError keep theirs; anything else is IoError) with
  // "<what> failed on rank R: <message>". Collective; nothing hangs when
  // only some ranks fail.
  void agree(std::string_view what, const std::function<void()>& body);

 protected:
  Communicator(std::string name, CommOptions options)
      : name_(std::move(name)), options_(options) {}

  // The backends' collectives, called after the checks above. `in_place` is
  // decided once here (see the contracts at the top).
  virtual WorkPtr do_all_gather(const Tensor& input, const Tensor& output, bool in_place) = 0;
  virtual WorkPtr do_reduce_scatter(const Tensor& input, const Tensor& output, const ReduceOptions& options,
                                    bool in_place) = 0;
  virtual WorkPtr do_all_reduce(const Tensor& input, const Tensor& output, const ReduceOptions& options,
                                bool in_place) = 0;
  virtual WorkPtr do_broadcast(const Tensor& tensor, int root) = 0;
  virtual WorkPtr do_all_to_all(const Tensor& input, const Tensor& output, bool in_place) = 0;
  // Counts checked: size() of them each, non-negative, within the tensors.
  virtual WorkPtr do_all_to_all_v(const Tensor& input, const std::vector<int64_t>& send_counts,
                                  const Tensor& output, const std::vector<int64_t>& recv_counts) = 0;
  // Blocking: rank r's `bytes` bytes at `mine` land at all[r * bytes, ...)
  // on every rank; `bytes` is equal on every rank. Host memory.
  virtual void do_host_all_gather(const void* mine, size_t bytes, void* all) = 0;

 private:
  void check_tensor(const Tensor& t, const char* what) const;
  void note_issued(const char* op, const Tensor& t);

  struct Issued {
    const char* op = nullptr;
    int64_t count = 0;
    DType dtype = DType::kF32;
    uint64_t number = 0;  // data-plane collectives issued here so far
    uint64_t order = 0;   // process-wide
  };
  std::string name_;
  CommOptions options_;
  Issued last_;
};

}  // namespace mp

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
#include <memory>
#include <string>

#include "comm/work.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace mp {

enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };
enum class ReduceAccumulate : uint8_t { kWire = 0, kFp32 = 1 };

std::string_view reduce_op_name(ReduceOp op);

struct ReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  double divide_factor = 1.0;
  ReduceAccumulate accumulate = ReduceAccumulate::kWire;
};

// Behaviour of a communicator; CommConfig in proto/mp.proto maps onto it.
struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
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

  virtual WorkPtr all_gather(const Tensor& input, const Tensor& output) = 0;
  virtual WorkPtr reduce_scatter(const Tensor& input, const Tensor& output,
                                 const ReduceOptions& options = {}) = 0;
  virtual WorkPtr all_reduce(const Tensor& input, const Tensor& output,
                             const ReduceOptions& options = {}) = 0;
  virtual WorkPtr broadcast(const Tensor& tensor, int root) = 0;
  virtual WorkPtr all_to_all(const Tensor& input, const Tensor& output) = 0;
  virtual WorkPtr barrier() = 0;
  // A Work that completes when everything issued so far on stream() has.
  virtual WorkPtr fence(const std::string& what) = 0;

  // Collective over this communicator: ranks with the same color form a new
  // communicator, ordered by (key, rank). A negative color gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

 protected:
  Communicator(std::string name, CommOptions options)
      : name_(std::move(name)), options_(options) {}

 private:
  std::string name_;
  CommOptions options_;
};

}  // namespace mp

// comm/host_rounds.h: Note [Chunked reduction] (comm/chunked_reduction.h) in
// host memory, for the backends whose transfers land in CPU memory (MPI,
// Gloo): the bounded scratch of two receive slots, where each round's parts
// lie, and their accumulation in rank order (kernels/cpu/reduce.h). A
// backend adds only its exchange: start() posts the round's transfers
// between place()'s buffers, finish() waits for them. Internal to comm/.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/chunked_reduction.h"
#include "core/allocator.h"
#include "core/tensor.h"
#include "kernels/reduce_math.h"

namespace mp::comm_detail {

// The round size for `accumulate_chunk_bytes` of scratch in all (two slots of
// size() parts), and `*scratch` (re)allocated to hold it.
int64_t host_round_piece(size_t accumulate_chunk_bytes, const Tensor& input, int size, Allocator& allocator,
                         Tensor* scratch);

class HostRounds : public RoundTransport {
 public:
  // kFp32: in fp64, divided by `divisor`, rounded once into `out`; `wire`:
  // pairwise in the input's dtype (out has it, divisor 1).
  HostRounds(int rank, int size, const Tensor& input, const Tensor& scratch, const Tensor& out, math::ElementOp op,
             double divisor, bool wire);

  int slots() const override { return 2; }
  void accumulate(int64_t begin, int64_t piece, int64_t recv, int slot) override;

 protected:
  // Rank j's part of the round starting at `begin`, in `slot`: this rank's
  // own is read from its input in place, the others land in the scratch.
  char* place(const ChunkSplit& split, int64_t begin, int64_t piece, int slot, int j);
  // The round's part of chunk j of this rank's input, to send to rank j.
  char* outgoing(const ChunkSplit& split, int64_t begin, int j) const;

  int rank_, size_;
  Tensor input_, scratch_, out_;

 private:
  math::ElementOp op_;
  double divisor_;
  bool wire_;
  std::vector<const void*> pieces_[2];  // per slot, in rank order
};

}  // namespace mp::comm_detail

// comm/chunked_reduction.h: the reduction every backend runs for
// reduce_accumulate kFp32 (and MPI's kWire reduce-scatter), written once over
// two transport primitives that each backend supplies. Internal to comm/.
//
// Note [Chunked reduction]
// Rank j owns chunk j, elements [offsets[j], offsets[j] + counts[j]) of
// every rank's input (equal_chunks: the reduce-scatter's output slices;
// ceil_chunks: an all-reduce's first half, before every rank gathers every
// chunk). Round by round, at most `piece` elements of each chunk at a time:
//   1. exchange: this rank sends the round's part of chunk j to rank j and
//      receives the round's part of its own chunk from every other rank
//      (every send and receive of the round in flight together, both
//      directions of every link busy);
//   2. accumulate: the round's size() parts of its chunk, its own included,
//      are added locally, always in rank order 0, 1, ..., size() - 1, in
//      fp64 for kFp32 (rounded once to the output dtype after the divisor),
//      or pairwise in the wire dtype for kWire.
// Every rank runs the rounds of the longest chunk, also where its own is
// shorter or empty (it then receives nothing but still sends), so the
// rounds match on every rank. A transport with two slots (MPI) starts round
// r + 1's exchange before it accumulates round r, so the links stay busy
// while the host adds; one with one slot (NCCL) orders them on its stream. Determinism: an element's sum has the same
// terms in the same order whatever the backend, the round size or the
// thread count; with the same inputs a rank count gives the same bits on
// MPI and on NCCL up to the accumulating kernels (CPU and CUDA share the
// element math, kernels/reduce_math.h).
#pragma once

#include <cstdint>
#include <vector>

namespace mp::comm_detail {

struct ChunkSplit {
  std::vector<int64_t> offsets, counts;
  int64_t longest() const;
};

// Chunk j = [j * n, (j + 1) * n): a reduce-scatter's output slices.
ChunkSplit equal_chunks(int size, int64_t n);
// ceil(n / size) elements each, the last ones shorter or empty: an
// all-reduce of n elements split among the ranks.
ChunkSplit ceil_chunks(int size, int64_t n);

// One round of Note [Chunked reduction]: what a backend supplies. A round
// uses one of the transport's slots (its receive buffers), `slot` < slots().
class RoundTransport {
 public:
  virtual ~RoundTransport() = default;
  // 1 or 2: how many rounds may be in flight at once.
  virtual int slots() const = 0;
  // Step 1 for the round starting at element `begin` of every chunk: sends
  // min(piece, counts[j] - begin) elements (when positive) of chunk j to
  // rank j, receives `recv` elements of this rank's chunk from every other
  // rank into `slot`. May return before they have arrived.
  virtual void start(const ChunkSplit& split, int64_t begin, int64_t piece, int64_t recv, int slot) = 0;
  // Returns once the round started in `slot` has arrived (or is ordered
  // before step 2 on the backend's stream).
  virtual void finish(int slot) = 0;
  // Step 2: adds the round's parts, in rank order, into the output's
  // elements [begin, begin + recv) of this rank's chunk. Only when recv > 0.
  virtual void accumulate(int64_t begin, int64_t piece, int64_t recv, int slot) = 0;
};

// The rounds of Note [Chunked reduction], on `transport`, for this rank
// (`rank`) of the split.
void reduce_chunks(RoundTransport& transport, const ChunkSplit& split, int rank, int64_t piece);

}  // namespace mp::comm_detail

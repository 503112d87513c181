#include "comm/host_rounds.h"

#include <algorithm>

#include "comm/backend_util.h"
#include "core/error.h"
#include "kernels/cpu/reduce.h"

namespace mp::comm_detail {

int64_t host_round_piece(size_t accumulate_chunk_bytes, const Tensor& input, int size, Allocator& allocator,
                         Tensor* scratch) {
  const size_t elem = dtype_size(input.dtype());
  const int64_t piece =
      std::max<int64_t>(1, static_cast<int64_t>(accumulate_chunk_bytes / (2 * elem * static_cast<size_t>(size))));
  const int64_t elements = 2 * piece * size;
  if (!scratch->defined() || scratch->dtype() != input.dtype() || scratch->numel() < elements) {
    *scratch = Tensor();  // release first: at most one scratch buffer at a time
    *scratch = Tensor::empty(allocator, input.dtype(), {elements}, MemCategory::kCommScratch);
  }
  return piece;
}

HostRounds::HostRounds(int rank, int size, const Tensor& input, const Tensor& scratch, const Tensor& out,
                       math::ElementOp op, double divisor, bool wire)
    : rank_(rank), size_(size), input_(input), scratch_(scratch), out_(out), op_(op), divisor_(divisor), wire_(wire) {
  MP_ENFORCE(!wire || (out.dtype() == input.dtype() && divisor == 1.0), "wire accumulation into ", out.describe(),
             " from ", input.describe(), " with divisor ", divisor);
  for (auto& p : pieces_) p.resize(static_cast<size_t>(size));
}

char* HostRounds::place(const ChunkSplit& split, int64_t begin, int64_t piece, int slot, int j) {
  char* at = j == rank_ ? element_ptr(input_, split.offsets[static_cast<size_t>(rank_)] + begin)
                        : element_ptr(scratch_, (slot * size_ + j) * piece);
  pieces_[slot][static_cast<size_t>(j)] = at;
  return at;
}

char* HostRounds::outgoing(const ChunkSplit& split, int64_t begin, int j) const {
  return element_ptr(input_, split.offsets[static_cast<size_t>(j)] + begin);
}

void HostRounds::accumulate(int64_t begin, int64_t /*piece*/, int64_t recv, int slot) {
  const void* const* pieces = pieces_[slot].data();
  if (wire_) {
    accumulate_rank_pieces_wire_cpu(pieces, input_.dtype(), size_, recv, element_ptr(out_, begin), op_);
  } else {
    accumulate_rank_pieces_cpu(pieces, input_.dtype(), size_, recv, element_ptr(out_, begin), out_.dtype(), op_,
                               divisor_);
  }
}

}  // namespace mp::comm_detail

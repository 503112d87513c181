#include "comm/chunked_reduction.h"

#include <algorithm>

#include "core/error.h"

namespace mp::comm_detail {

int64_t ChunkSplit::longest() const { return counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end()); }

ChunkSplit equal_chunks(int size, int64_t n) {
  ChunkSplit s{std::vector<int64_t>(static_cast<size_t>(size)), std::vector<int64_t>(static_cast<size_t>(size), n)};
  for (int j = 0; j < size; ++j) s.offsets[static_cast<size_t>(j)] = j * n;
  return s;
}

ChunkSplit ceil_chunks(int size, int64_t n) {
  const int64_t chunk = (n + size - 1) / std::max(size, 1);
  ChunkSplit s{std::vector<int64_t>(static_cast<size_t>(size)), std::vector<int64_t>(static_cast<size_t>(size))};
  for (int j = 0; j < size; ++j) {
    const size_t i = static_cast<size_t>(j);
    s.offsets[i] = std::min(j * chunk, n);
    s.counts[i] = std::min(chunk, n - s.offsets[i]);
  }
  return s;
}

void reduce_chunks(RoundTransport& transport, const ChunkSplit& split, int rank, int64_t piece) {
  MP_ENFORCE(piece > 0, "chunked reduction with rounds of ", piece, " elements");
  const int64_t mine = split.counts.at(static_cast<size_t>(rank));
  const int64_t longest = split.longest();
  for (int64_t begin = 0; begin < longest; begin += piece) {
    const int64_t recv = std::clamp<int64_t>(mine - begin, 0, piece);
    transport.exchange(split, begin, piece, recv);
    if (recv > 0) transport.accumulate(begin, piece, recv);
  }
}

}  // namespace mp::comm_detail

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
  const int64_t rounds = (longest + piece - 1) / piece;
  const int slots = transport.slots();
  MP_ENFORCE(slots == 1 || slots == 2, "a round transport with ", slots, " slots");
  auto recv_of = [&](int64_t r) { return std::clamp<int64_t>(mine - r * piece, 0, piece); };
  auto start = [&](int64_t r) { transport.start(split, r * piece, piece, recv_of(r), static_cast<int>(r % slots)); };
  if (rounds > 0) start(0);
  for (int64_t r = 0; r < rounds; ++r) {
    // With two slots the next round's exchange is under way while this one
    // is added (its slot was freed by the accumulation of round r - 1).
    if (slots == 2 && r + 1 < rounds) start(r + 1);
    transport.finish(static_cast<int>(r % slots));
    if (recv_of(r) > 0) transport.accumulate(r * piece, piece, recv_of(r), static_cast<int>(r % slots));
    if (slots == 1 && r + 1 < rounds) start(r + 1);
  }
}

}  // namespace mp::comm_detail

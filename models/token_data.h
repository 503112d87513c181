// models/token_data.h: where the GPT's tokens come from.
//
// A TokenBatchSource fills micro-batch `global_index`: the engine numbers
// micro-batches g = ((step - 1) * world + ...) so that every rank's are
// disjoint and a step's are a pure function of the step number (runtime/
// engine.cc). So a source that is a pure function of g gives each rank
// disjoint, deterministic slices of the data, and resuming at step s needs
// nothing but s.
//
// Two sources:
//  - GptData (models/gpt.h): the embedded synthetic language.
//  - TokenWindows: windows of an llm.c token file (formats/token_file.h).
//
// Note [Token windows]
// A token range [begin, end) holds W = (end - begin - 1) / T windows of T + 1
// tokens at stride T (window w starts at begin + w T): inputs are its first
// T tokens, targets its last T, as llm.c's loader reads them. Sequence s =
// g * B + b (B = micro_batch_size) is in epoch e = s / W at position p = s %
// W, and reads window perm_e(p), where perm_e is a pseudo-random permutation
// of [0, W) drawn from (seed, e): a 4-round Feistel network over the next
// power of four >= W with cycle walking, so it needs no table and costs
// O(1) per sequence. Every epoch visits every window once; consecutive
// sequences land far apart in the file. shuffle = false reads windows in
// order (validation).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/token_file.h"

namespace mp {

class TokenBatchSource {
 public:
  virtual ~TokenBatchSource() = default;
  virtual int64_t batch() const = 0;    // sequences per micro-batch, B
  virtual int64_t context() const = 0;  // tokens per sequence, T
  // inputs, targets: B * T tokens each, row-major [B, T]. global_index >= 0.
  virtual void micro_batch(int64_t global_index, int32_t* inputs, int32_t* targets) const = 0;
  // What the source reads, for logs ("synthetic Markov language (vocab
  // 256)", "train.bin tokens [0, 9000)").
  virtual std::string describe() const = 0;
};

// The bijection of Note [Token windows] on [0, n); n >= 1.
class WindowPermutation {
 public:
  WindowPermutation(int64_t n, uint64_t seed, uint64_t epoch);
  int64_t operator()(int64_t p) const;

 private:
  uint64_t round(int r, uint64_t half) const;

  int64_t n_ = 1;
  int half_bits_ = 0;  // the network permutes [0, 4^half_bits)
  uint64_t seed_ = 0;
  uint64_t epoch_ = 0;
};

class TokenWindows final : public TokenBatchSource {
 public:
  // Windows of tokens [begin, end) of `file` (shared: a train and a
  // validation source may read one file). Throws ConfigError naming the file
  // when the range holds no window of context + 1 tokens.
  TokenWindows(std::shared_ptr<const TokenFile> file, int64_t begin, int64_t end, int64_t batch, int64_t context,
               uint64_t seed, bool shuffle);

  int64_t batch() const override { return batch_; }
  int64_t context() const override { return context_; }
  void micro_batch(int64_t global_index, int32_t* inputs, int32_t* targets) const override;
  std::string describe() const override;

  int64_t windows() const { return windows_; }
  // The first token of the window sequence s reads.
  int64_t window_start(int64_t sequence) const;

 private:
  std::shared_ptr<const TokenFile> file_;
  int64_t begin_ = 0, end_ = 0, batch_ = 0, context_ = 0, windows_ = 0;
  uint64_t seed_ = 0;
  bool shuffle_ = true;
};

}  // namespace mp

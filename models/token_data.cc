#include "models/token_data.h"

#include <sstream>
#include <utility>

#include "core/error.h"
#include "kernels/philox_math.h"

namespace mp {

// ---- WindowPermutation ----------------------------------------------------------

WindowPermutation::WindowPermutation(int64_t n, uint64_t seed, uint64_t epoch) : n_(n), seed_(seed), epoch_(epoch) {
  MP_ENFORCE_GE(n, 1, "windows to permute");
  half_bits_ = 1;
  while ((int64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
}

// The Feistel round function: 32 bits of philox keyed by (seed, epoch, round).
uint64_t WindowPermutation::round(int r, uint64_t half) const {
  const uint64_t stream = (epoch_ << 2) | static_cast<uint64_t>(r);
  return math::philox_u32(seed_ ^ 0x9e3779b97f4a7c15ull, stream, half);
}

int64_t WindowPermutation::operator()(int64_t p) const {
  MP_ENFORCE(p >= 0 && p < n_, "window position ", p, " outside [0, ", n_, ")");
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  auto x = static_cast<uint64_t>(p);
  // Cycle walking: a permutation of [0, 4^h) restricted to [0, n) by
  // re-applying it until the value lands inside; at most ~4 rounds expected.
  do {
    uint64_t left = x >> half_bits_, right = x & mask;
    for (int r = 0; r < 4; ++r) {
      const uint64_t next = left ^ (round(r, right) & mask);
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(x);
}

// ---- TokenWindows ---------------------------------------------------------------

TokenWindows::TokenWindows(std::shared_ptr<const TokenFile> file, int64_t begin, int64_t end, int64_t batch,
                           int64_t context, uint64_t seed, bool shuffle)
    : file_(std::move(file)), begin_(begin), end_(end), batch_(batch), context_(context), seed_(seed),
      shuffle_(shuffle) {
  MP_ENFORCE(file_ != nullptr, "token file");
  MP_ENFORCE(0 <= begin && begin <= end && end <= file_->size(), "token range [", begin, ", ", end, ") of ",
             file_->size());
  MP_ENFORCE(batch >= 1 && context >= 1, "batch ", batch, " and context ", context);
  windows_ = end - begin > context ? (end - begin - 1) / context : 0;
  if (windows_ == 0) {
    MP_THROW(ConfigError, file_->path(), ": tokens [", begin, ", ", end, ") hold ", end - begin,
             " tokens, fewer than one sequence of context + 1 = ", context + 1);
  }
}

int64_t TokenWindows::window_start(int64_t sequence) const {
  MP_ENFORCE_GE(sequence, 0, "sequence index");
  const int64_t epoch = sequence / windows_, p = sequence % windows_;
  const int64_t w = shuffle_ ? WindowPermutation(windows_, seed_, static_cast<uint64_t>(epoch))(p) : p;
  return begin_ + w * context_;
}

void TokenWindows::micro_batch(int64_t global_index, int32_t* inputs, int32_t* targets) const {
  MP_ENFORCE_GE(global_index, 0, "micro-batch index");
  const uint16_t* tokens = file_->tokens().data();
  for (int64_t b = 0; b < batch_; ++b) {
    const uint16_t* w = tokens + window_start(global_index * batch_ + b);
    for (int64_t t = 0; t < context_; ++t) {
      inputs[b * context_ + t] = w[t];
      targets[b * context_ + t] = w[t + 1];
    }
  }
}

std::string TokenWindows::describe() const {
  std::ostringstream os;
  os << file_->path() << " tokens [" << begin_ << ", " << end_ << "): " << windows_ << " windows of " << context_ + 1
     << (shuffle_ ? ", shuffled per epoch" : ", in order");
  return os.str();
}

}  // namespace mp

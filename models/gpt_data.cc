// models/gpt_data.cc: the GPT's synthetic language (Note [GPT data] in
// models/gpt.h).
#include "models/gpt.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/philox_math.h"

namespace mp {

GptData::GptData(const GptConfig& config) {
  validate(config);
  vocab_ = config.vocab;
  context_ = config.context;
  batch_ = config.micro_batch_size;
  seed_ = config.data_seed;
  successors_.resize(static_cast<size_t>(vocab_ * kGptSuccessors));
  for (size_t i = 0; i < successors_.size(); ++i) {
    const uint32_t word = math::philox_u32(seed_, kGptTransitionStream, i);
    successors_[i] = static_cast<int32_t>(word % static_cast<uint64_t>(vocab_));
  }
}

void GptData::sequence(int64_t index, int32_t* tokens) const {
  MP_ENFORCE_GE(index, 0, "sequence index");
  walk(index, tokens, tokens + 1);
}

void GptData::micro_batch(int64_t global_index, int32_t* inputs, int32_t* targets) const {
  MP_ENFORCE_GE(global_index, 0, "micro-batch index");
  for (int64_t b = 0; b < batch_; ++b) {
    walk(global_index * batch_ + b, inputs + b * context_, targets + b * context_);
  }
}

// Token j of the sequence goes to inputs[j] (j < context) and targets[j - 1]
// (j >= 1). Word j >= 1: noise when bits 0-2 are all zero (1/8), the noise
// token from bits 8-31; else the successor that bits 3-4 pick.
void GptData::walk(int64_t index, int32_t* inputs, int32_t* targets) const {
  const auto stream = static_cast<uint64_t>(index);
  const auto vocab = static_cast<uint64_t>(vocab_);
  auto token = static_cast<int32_t>(math::philox_u32(seed_, stream, 0) % vocab);
  inputs[0] = token;
  for (int64_t j = 1; j <= context_; ++j) {
    const uint32_t word = math::philox_u32(seed_, stream, static_cast<uint64_t>(j));
    if ((word & 7u) == 0) {
      token = static_cast<int32_t>((word >> 8) % vocab);
    } else {
      token = successors_[static_cast<size_t>(token * kGptSuccessors + ((word >> 3) & 3u))];
    }
    targets[j - 1] = token;
    if (j < context_) inputs[j] = token;
  }
}

std::string GptData::describe() const {
  return "synthetic Markov language (vocab " + std::to_string(vocab_) + ", seed " + std::to_string(seed_) + ")";
}

// P(x % n == v) for x uniform on [0, 2^bits): the count of such x over 2^bits.
static double uniform_mod_probability(int bits, uint64_t n, uint64_t v) {
  const uint64_t range = uint64_t{1} << bits;
  return static_cast<double>((range - 1 - v) / n + 1) / static_cast<double>(range);
}

double GptData::entropy_floor() const {
  const auto vocab = static_cast<size_t>(vocab_);
  std::vector<double> noise(vocab), dist(vocab), next(vocab), row(vocab);
  for (size_t w = 0; w < vocab; ++w) {
    noise[w] = uniform_mod_probability(24, vocab, w);  // bits 8-31 of the word
    dist[w] = uniform_mod_probability(32, vocab, w);   // token 0
  }
  // H(next | v) and the transition rows, one token v at a time.
  std::vector<double> entropy(vocab);
  std::vector<std::vector<double>> transition(vocab);
  for (size_t v = 0; v < vocab; ++v) {
    for (size_t w = 0; w < vocab; ++w) row[w] = noise[w] / 8.0;
    for (int64_t j = 0; j < kGptSuccessors; ++j) {
      row[static_cast<size_t>(successors_[v * kGptSuccessors + static_cast<size_t>(j)])] +=
          7.0 / 8.0 / static_cast<double>(kGptSuccessors);
    }
    double h = 0;
    for (size_t w = 0; w < vocab; ++w) {
      if (row[w] > 0) h -= row[w] * std::log(row[w]);
    }
    entropy[v] = h;
    transition[v] = row;
  }
  // Target j (1 .. context) follows token j - 1, whose distribution is
  // token 0's pushed through the chain j - 1 times.
  double total = 0;
  for (int64_t j = 1; j <= context_; ++j) {
    double expected = 0;
    for (size_t v = 0; v < vocab; ++v) expected += dist[v] * entropy[v];
    total += expected;
    std::fill(next.begin(), next.end(), 0.0);
    for (size_t v = 0; v < vocab; ++v) {
      for (size_t w = 0; w < vocab; ++w) next[w] += dist[v] * transition[v][w];
    }
    dist.swap(next);
  }
  return total / static_cast<double>(context_);
}

}  // namespace mp

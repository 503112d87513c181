// models/gpt_data.cc: the GPT's synthetic language (Note [GPT data] in
// models/gpt.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/philox_math.h"
#include "models/gpt.h"

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

// A transition row is noise / 8 everywhere plus 7 / (8 K) for each of v's K
// successors (a successor drawn twice counts twice), so a row's entropy is
// the noise row's with at most K terms replaced, and pushing a distribution
// through the chain is the noise part times its mass plus K scattered adds:
// O(vocab K) per position, not vocab^2 (GPT-2's vocabulary would need a
// 20 GB matrix).
double GptData::entropy_floor() const {
  const auto vocab = static_cast<size_t>(vocab_);
  const auto K = static_cast<size_t>(kGptSuccessors);
  const double hop = 7.0 / 8.0 / static_cast<double>(K);
  std::vector<double> noise(vocab), dist(vocab), next(vocab);
  for (size_t w = 0; w < vocab; ++w) {
    noise[w] = uniform_mod_probability(24, vocab, w) / 8.0;  // bits 8-31 of the word
    dist[w] = uniform_mod_probability(32, vocab, w);         // token 0
  }
  auto plogp = [](double p) { return p > 0 ? p * std::log(p) : 0.0; };
  double noise_entropy = 0;
  for (size_t w = 0; w < vocab; ++w) noise_entropy -= plogp(noise[w]);
  // H(next | v): the noise row's entropy with v's successor entries replaced.
  std::vector<double> entropy(vocab);
  std::vector<std::pair<size_t, int>> hits;  // (successor, times drawn)
  for (size_t v = 0; v < vocab; ++v) {
    hits.clear();
    for (size_t j = 0; j < K; ++j) {
      const auto w = static_cast<size_t>(successors_[v * K + j]);
      auto it = std::find_if(hits.begin(), hits.end(), [w](const auto& h) { return h.first == w; });
      if (it == hits.end()) hits.emplace_back(w, 1); else ++it->second;
    }
    double h = noise_entropy;
    for (const auto& [w, times] : hits) h += plogp(noise[w]) - plogp(noise[w] + hop * times);
    entropy[v] = h;
  }
  // Target j (1 .. context) follows token j - 1, whose distribution is
  // token 0's pushed through the chain j - 1 times.
  double total = 0;
  for (int64_t j = 1; j <= context_; ++j) {
    double expected = 0, mass = 0;
    for (size_t v = 0; v < vocab; ++v) {
      expected += dist[v] * entropy[v];
      mass += dist[v];
    }
    total += expected;
    for (size_t w = 0; w < vocab; ++w) next[w] = noise[w] * mass;
    for (size_t v = 0; v < vocab; ++v) {
      for (size_t k = 0; k < K; ++k) next[static_cast<size_t>(successors_[v * K + k])] += dist[v] * hop;
    }
    dist.swap(next);
  }
  return total / static_cast<double>(context_);
}

}  // namespace mp

// Token sources (models/token_data.h): the window permutation is a
// bijection, an epoch visits every window once, ranks read disjoint
// windows, validation reads in order, and the synthetic language's entropy
// floor matches a Monte Carlo estimate of the true chain's loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/token_file.h"
#include "models/gpt.h"
#include "models/token_data.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

namespace mp {
namespace {

// A token file whose token i is i % 65521 (so a window's start is readable
// from its first token while i < 65521).
std::shared_ptr<const TokenFile> counting_file(int64_t n) {
  const testing::TempDir dir("token_data");
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<uint16_t>(i % 65521);
  write_token_file(dir.path("t.bin"), tokens);
  return std::make_shared<const TokenFile>(TokenFile::read(dir.path("t.bin")));
}

TEST(TokenData, PermutationIsABijectionForEverySize) {
  for (int64_t n : {1, 2, 3, 4, 5, 16, 17, 100, 1000, 4097}) {
    for (uint64_t epoch : {0u, 1u, 7u}) {
      const WindowPermutation perm(n, 42, epoch);
      std::vector<int> seen(static_cast<size_t>(n), 0);
      for (int64_t p = 0; p < n; ++p) {
        const int64_t w = perm(p);
        ASSERT_TRUE(w >= 0 && w < n) << n << " " << p << " -> " << w;
        ++seen[static_cast<size_t>(w)];
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; })) << "n " << n;
    }
  }
  // Different epochs and seeds give different orders (for n large enough).
  const WindowPermutation a(1000, 42, 0), b(1000, 42, 1), c(1000, 43, 0);
  int same_ab = 0, same_ac = 0;
  for (int64_t p = 0; p < 1000; ++p) {
    same_ab += a(p) == b(p);
    same_ac += a(p) == c(p);
  }
  EXPECT_LT(same_ab, 20);
  EXPECT_LT(same_ac, 20);
}

TEST(TokenData, WindowsHoldInputsAndShiftedTargets) {
  const auto file = counting_file(1000);
  const int64_t batch = 3, context = 8;
  const TokenWindows windows(file, 100, 900, batch, context, 7, true);
  EXPECT_EQ(windows.windows(), (800 - 1) / 8);
  std::vector<int32_t> in(batch * context), tgt(batch * context);
  windows.micro_batch(5, in.data(), tgt.data());
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = windows.window_start(5 * batch + b);
    EXPECT_GE(start, 100);
    EXPECT_LE(start + context + 1, 900);
    EXPECT_EQ((start - 100) % context, 0);
    for (int64_t t = 0; t < context; ++t) {
      EXPECT_EQ(in[static_cast<size_t>(b * context + t)], start + t);
      EXPECT_EQ(tgt[static_cast<size_t>(b * context + t)], start + t + 1);
    }
  }
}

// The engine's micro-batch numbering g = ((step - 1) W + m) ... + r gives
// rank r the indices congruent to r mod W: within an epoch those read
// disjoint windows, and the epoch covers every window exactly once.
TEST(TokenData, RanksReadDisjointWindowsAndAnEpochCoversAll) {
  const auto file = counting_file(20000);
  const int64_t batch = 2, context = 16;
  const TokenWindows windows(file, 0, file->size(), batch, context, 3, true);
  const int64_t w = windows.windows();
  const int world = 3;
  std::vector<std::set<int64_t>> per_rank(world);
  std::vector<int> count(static_cast<size_t>(w), 0);
  for (int64_t s = 0; s < w; ++s) {
    const int64_t start = windows.window_start(s);
    ++count[static_cast<size_t>(start / context)];
    per_rank[static_cast<size_t>((s / batch) % world)].insert(start);
  }
  EXPECT_TRUE(std::all_of(count.begin(), count.end(), [](int c) { return c == 1; }));
  for (int a = 0; a < world; ++a) {
    for (int b = a + 1; b < world; ++b) {
      for (int64_t x : per_rank[static_cast<size_t>(a)]) EXPECT_EQ(per_rank[static_cast<size_t>(b)].count(x), 0u);
    }
  }
  // The next epoch reshuffles but again covers every window once.
  std::fill(count.begin(), count.end(), 0);
  int moved = 0;
  for (int64_t s = w; s < 2 * w; ++s) {
    ++count[static_cast<size_t>(windows.window_start(s) / context)];
    moved += windows.window_start(s) != windows.window_start(s - w);
  }
  EXPECT_TRUE(std::all_of(count.begin(), count.end(), [](int c) { return c == 1; }));
  EXPECT_GT(moved, w / 2);
  // Pure function of the index: resuming at any step reads the same data.
  const TokenWindows again(file, 0, file->size(), batch, context, 3, true);
  for (int64_t s : {0, 1, 77, 5000}) EXPECT_EQ(again.window_start(s), windows.window_start(s));
}

TEST(TokenData, InOrderWindowsForValidation) {
  const auto file = counting_file(100);
  const TokenWindows windows(file, 10, 100, 2, 4, 0, false);
  for (int64_t s = 0; s < 2 * windows.windows(); ++s) {
    EXPECT_EQ(windows.window_start(s), 10 + (s % windows.windows()) * 4);
  }
}

TEST(TokenData, TooFewTokensNameTheFile) {
  const auto file = counting_file(20);
  try {
    TokenWindows(file, 0, 16, 1, 16, 0, true);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find(file->path()), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("fewer than one sequence of context + 1 = 17"), std::string::npos) << e.message();
  }
  EXPECT_NO_THROW(TokenWindows(file, 0, 17, 1, 16, 0, true));
}

GptConfig small(int64_t vocab, int64_t context) {
  GptConfig c = testing::gpt_config(vocab, context, 8, 2, 1, 4, /*threads=*/0);
  c.data_seed = 99;
  return c;
}

// The floor is the true chain's expected loss: estimate it by sampling
// sequences and scoring each target with the chain's exact conditional
// probability, recovered from the transition counts of a huge sample.
TEST(TokenData, SyntheticEntropyFloorMatchesMonteCarlo) {
  for (int64_t vocab : {16, 70}) {
    const GptConfig c = small(vocab, 8);
    const GptData data(c);
    const double floor = data.entropy_floor();
    EXPECT_GT(floor, 0.5);
    EXPECT_LT(floor, std::log(static_cast<double>(vocab)));
    // Empirical conditional distribution from many sequences.
    const int64_t sequences = 200000;
    std::vector<double> counts(static_cast<size_t>(vocab * vocab), 0.0), rows(static_cast<size_t>(vocab), 0.0);
    std::vector<int32_t> seq(static_cast<size_t>(c.context + 1));
    for (int64_t s = 0; s < sequences; ++s) {
      data.sequence(s, seq.data());
      for (int64_t j = 1; j <= c.context; ++j) {
        counts[static_cast<size_t>(seq[static_cast<size_t>(j - 1)] * vocab + seq[static_cast<size_t>(j)])] += 1;
        rows[static_cast<size_t>(seq[static_cast<size_t>(j - 1)])] += 1;
      }
    }
    // The plug-in entropy of those counts, weighted as the loss weights them.
    double total = 0, n = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      for (int64_t w = 0; w < vocab; ++w) {
        const double k = counts[static_cast<size_t>(v * vocab + w)];
        if (k > 0) total -= k * std::log(k / rows[static_cast<size_t>(v)]);
      }
      n += rows[static_cast<size_t>(v)];
    }
    // The plug-in estimate is biased low by about (cells - rows) / (2 n).
    const double estimate = total / n + static_cast<double>(vocab * (vocab - 1)) / (2 * n);
    EXPECT_NEAR(estimate, floor, 0.01) << "vocab " << vocab;
  }
}

TEST(TokenData, GptSwitchesSourcesOfTheSameShape) {
  const GptConfig c = small(64, 8);
  Gpt model(c);
  EXPECT_NE(model.source().describe().find("synthetic Markov language (vocab 64"), std::string::npos);
  const auto file = counting_file(200);
  EXPECT_THROW(model.set_source(std::make_shared<TokenWindows>(file, 0, 200, 2, 8, 0, true)), EnforceError);
  model.set_source(std::make_shared<TokenWindows>(file, 0, 200, 4, 8, 0, false));
  model.begin_micro_batch(1);
  EXPECT_EQ(model.inputs()[0], 4 * 8);  // sequence 4, in order
  EXPECT_EQ(model.targets()[0], 4 * 8 + 1);
}

}  // namespace
}  // namespace mp
namespace mp {
namespace {

// GPT-2's vocabulary: the floor takes O(context x vocab x successors), not a
// vocab^2 transition matrix (20 GB at 50257, which killed mp_worker with
// GPT-2's shape on the synthetic data). Agreed with the dense computation to
// 4e-14 at vocab 16-1000 when it was replaced.
TEST(TokenData, EntropyFloorOfGpt2sVocabularyIsCheap) {
  const GptData data(small(50257, 64));
  const auto t0 = std::chrono::steady_clock::now();
  const double floor = data.entropy_floor();
  EXPECT_GT(floor, 2.0);
  EXPECT_LT(floor, std::log(50257.0));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

}  // namespace
}  // namespace mp

// tests/test_gemm_choice.cc: Note [GEMM algorithm choice]
// (kernels/gemm_choice.h) with a fake clock, the book of choices, and (in a
// CUDA build, no device needed) the forms a cuBLASLt plan may take.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/gemm_choice.h"
#include "mp/config.h"
#if MP_WITH_CUDA
#include "kernels/cuda/gemm_cublaslt.h"
#endif

namespace mp {
namespace {

// A clock whose readings wander by up to +-jitter around each candidate's time.
struct FakeClock {
  std::vector<double> ms;
  std::mt19937 rng;
  double jitter = 0.3;
  int calls = 0;
  double operator()(int i) {
    ++calls;
    if (ms[static_cast<size_t>(i)] < 0) return -1.0;  // refused
    return ms[static_cast<size_t>(i)] * std::uniform_real_distribution<double>(1 - jitter, 1 + jitter)(rng);
  }
};

TEST(GemmChoice, DeterministicPlansForOneShapeKeepTheSameCandidateAndNeverTime) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    FakeClock a{{1.0, 0.5, 0.7}, std::mt19937(seed)}, b{{1.0, 0.5, 0.7}, std::mt19937(seed + 1000)};
    const int first = choose_gemm_candidate(3, true, std::ref(a));
    const int second = choose_gemm_candidate(3, true, std::ref(b));
    EXPECT_EQ(first, 0);
    EXPECT_EQ(first, second);
    EXPECT_EQ(a.calls + b.calls, 0) << "deterministic mode timed a candidate";
  }
}

TEST(GemmChoice, TimedChoiceKeepsTheFirstUnlessAnotherIsClearlyFaster) {
  // Near ties (1%) keep the heuristic's first while readings wander by 4%:
  // 0.99 x 0.96 never falls under kGemmClearlyFaster x 1.04.
  for (uint32_t seed = 0; seed < 50; ++seed) {
    FakeClock near{{1.0, 0.99, 1.01}, std::mt19937(seed), 0.04};
    EXPECT_EQ(choose_gemm_candidate(3, false, std::ref(near)), 0) << "seed " << seed;
    EXPECT_EQ(near.calls, 3 * kGemmChoiceRuns);
  }
  FakeClock clearly{{1.0, 0.5, 0.8}, std::mt19937(1)};
  EXPECT_EQ(choose_gemm_candidate(3, false, std::ref(clearly)), 1);
  FakeClock refused_first{{-1.0, 1.0, 1.1}, std::mt19937(2)};
  EXPECT_EQ(choose_gemm_candidate(3, false, std::ref(refused_first)), 1);
  FakeClock none{{-1.0, -1.0}, std::mt19937(3)};
  EXPECT_EQ(choose_gemm_candidate(2, false, std::ref(none)), -1);
}

TEST(GemmChoice, TheBookRoundTripsAndKeysByIdentity) {
  const std::string path = ::testing::TempDir() + "gemm_choices_test.tsv";
  GemmChoiceBook book;
  book.record("GPU A", "768x2304x768", GemmChoice{2, 17});
  book.record("GPU B", "768x2304x768", GemmChoice{0, 5});
  book.save(path);
  GemmChoiceBook read;
  EXPECT_EQ(read.load(path), 2);
  ASSERT_TRUE(read.find("GPU A", "768x2304x768").has_value());
  EXPECT_EQ(read.find("GPU A", "768x2304x768")->candidate, 2);
  EXPECT_EQ(read.find("GPU A", "768x2304x768")->algorithm, 17);
  EXPECT_EQ(read.find("GPU B", "768x2304x768")->algorithm, 5);
  EXPECT_FALSE(read.find("GPU C", "768x2304x768").has_value());
  std::filesystem::remove(path);
}

TEST(GemmChoice, ABadBookNamesTheFileAndLine) {
  const std::string path = ::testing::TempDir() + "gemm_choices_bad.tsv";
  std::ofstream(path) << "# comment\nGPU\tkey\t1\t2\nGPU\tkey\tone\t2\n";
  GemmChoiceBook book;
  try {
    book.load(path);
    FAIL() << "a bad line was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path + " line 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(book.load(path + ".missing"), IoError);
  std::filesystem::remove(path);
}

#if MP_WITH_CUDA
// The forms a cuBLASLt plan may take: host logic, no device needed.
TEST(GemmCudaForms, DgeluAndMisalignedEpiloguePointersAreNeverFused) {
  alignas(256) static float buf[4096];
  GemmProblem p = gemm_problem(64, 64, 64, GemmInput{buf, DType::kF32, 64, false},
                               GemmInput{buf, DType::kF32, 64, false}, buf, DType::kF32, false, buf + 64);
  const std::string fused = "fused in cuBLASLt's epilogue";
  EXPECT_EQ(gemm_cuda_forms(p).front(), fused);  // an aligned bias
  p.bias = buf + 65;                             // 4 bytes past 16-byte alignment
  for (const std::string& f : gemm_cuda_forms(p)) EXPECT_NE(f, fused);
  p.bias = nullptr;
  p.epilogue = GemmEpilogue::kDGelu;
  p.aux = buf + 128;
  p.aux_ld = 64;
  for (const std::string& f : gemm_cuda_forms(p)) EXPECT_NE(f, fused);
  p.epilogue = GemmEpilogue::kGelu;
  EXPECT_EQ(gemm_cuda_forms(p).front(), fused);
}
#endif

}  // namespace
}  // namespace mp

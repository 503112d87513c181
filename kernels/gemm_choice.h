// kernels/gemm_choice.h: which of a GEMM library's candidate algorithms a
// plan keeps, and the book of choices that makes a later process (a
// resumed run) keep the same ones. Host code in every build; the cuBLASLt
// GEMM (kernels/cuda/gemm_cublaslt.h) is its user.
//
// Note [GEMM algorithm choice]
// - Deterministic mode never times: the heuristic's first candidate, every
//   time, in every process.
// - Otherwise each candidate is timed kGemmChoiceRuns times and the
//   heuristic's first is kept unless another's median is under
//   kGemmClearlyFaster of the first's: a near tie keeps the first, so
//   noise rarely changes the choice.
// - Either way the choice is written in the book (key: the problem's shape,
//   dtypes, epilogue and pointer alignments), which a run saves beside its
//   output (gemm_choices.tsv) and loads again when it resumes: a key found
//   there keeps its recorded candidate, untimed, so a resumed run computes
//   with the bits of the run it continues. A book written for another
//   device or library is refused as a whole.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace mp {

inline constexpr int kGemmChoiceRuns = 5;
inline constexpr double kGemmClearlyFaster = 0.9;

// The candidate to keep among `candidates` (>= 1). `time_ms(i)` runs
// candidate i once and returns its milliseconds, or a negative value when
// the library refused it (never kept); it is never called when
// `deterministic`. Returns -1 when every candidate was refused.
int choose_gemm_candidate(int candidates, bool deterministic, const std::function<double(int)>& time_ms);

struct GemmChoice {
  int candidate = 0;   // index among the heuristic's candidates
  int algorithm = -1;  // the library's id of it, checked when read back
};

// The choices of this process (Note [GEMM algorithm choice]), each under
// the identity of the device and library it holds for ("NVIDIA H200, sm_90,
// 132 SMs, cuBLASLt 130100") and its problem's key. Thread-safe.
class GemmChoiceBook {
 public:
  std::optional<GemmChoice> find(const std::string& identity, const std::string& key) const;
  void record(const std::string& identity, const std::string& key, GemmChoice choice);
  // Adds the choices of the book at `path`; IoError naming the file and
  // line when it is not one. Returns the number read.
  int64_t load(const std::string& path);
  // Writes every choice atomically (a temporary file renamed over `path`).
  void save(const std::string& path) const;
  int64_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, GemmChoice> choices_;
};

// The process's book, which every GemmCuda consults.
GemmChoiceBook& gemm_choice_book();

}  // namespace mp

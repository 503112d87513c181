// kernels/gemm_choice.cc: Note [GEMM algorithm choice] in gemm_choice.h.
#include "kernels/gemm_choice.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"

namespace mp {

int choose_gemm_candidate(int candidates, bool deterministic, const std::function<double(int)>& time_ms) {
  MP_ENFORCE(candidates >= 1, "choosing among ", candidates, " GEMM candidates");
  if (deterministic) return 0;
  std::vector<double> median(static_cast<size_t>(candidates), -1.0);
  for (int i = 0; i < candidates; ++i) {
    std::vector<double> runs;
    for (int r = 0; r < kGemmChoiceRuns; ++r) {
      const double ms = time_ms(i);
      if (ms < 0) break;  // refused
      runs.push_back(ms);
    }
    if (runs.size() != static_cast<size_t>(kGemmChoiceRuns)) continue;
    std::nth_element(runs.begin(), runs.begin() + kGemmChoiceRuns / 2, runs.end());
    median[static_cast<size_t>(i)] = runs[kGemmChoiceRuns / 2];
  }
  int kept = -1;  // the first that ran, unless another is clearly faster
  for (int i = 0; i < candidates; ++i) {
    const double m = median[static_cast<size_t>(i)];
    if (m < 0) continue;
    if (kept < 0 || m < kGemmClearlyFaster * median[static_cast<size_t>(kept)]) kept = i;
  }
  return kept;
}

std::optional<GemmChoice> GemmChoiceBook::find(const std::string& identity, const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = choices_.find({identity, key});
  if (it == choices_.end()) return std::nullopt;
  return it->second;
}

void GemmChoiceBook::record(const std::string& identity, const std::string& key, GemmChoice choice) {
  std::lock_guard<std::mutex> lock(mu_);
  choices_[{identity, key}] = choice;
}

// One line a choice: identity, key, candidate, algorithm, tab-separated.
int64_t GemmChoiceBook::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) MP_THROW(IoError, "GEMM choices ", path, ": cannot be read");
  std::string line;
  int64_t n = 0;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string part; std::getline(ss, part, '\t');) f.push_back(part);
    GemmChoice c;
    size_t used = 0, used2 = 0;
    try {
      if (f.size() == 4) {
        c.candidate = std::stoi(f[2], &used);
        c.algorithm = std::stoi(f[3], &used2);
      }
    } catch (const std::exception&) {
      used = 0;
    }
    if (f.size() != 4 || used != f[2].size() || used2 != f[3].size() || c.candidate < 0) {
      MP_THROW(IoError, "GEMM choices ", path, " line ", number,
               ": not 'identity<TAB>key<TAB>candidate<TAB>algorithm'");
    }
    record(f[0], f[1], c);
    ++n;
  }
  return n;
}

void GemmChoiceBook::save(const std::string& path) const {
  std::string text = "# mp GEMM choices (Note [GEMM algorithm choice]): identity, key, candidate, algorithm\n";
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [k, c] : choices_)
      text += detail::str(k.first, '\t', k.second, '\t', c.candidate, '\t', c.algorithm, '\n');
  }
  write_file_atomic(path, text, "GEMM choices");
}

int64_t GemmChoiceBook::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(choices_.size());
}

GemmChoiceBook& gemm_choice_book() {
  static GemmChoiceBook book;
  return book;
}

}  // namespace mp

#include "models/gpt_sample.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "kernels/philox_math.h"

namespace mp {
namespace {

// The prompt: row 0 holds the text so far, the rest and the targets are zeros.
class PromptSource final : public TokenBatchSource {
 public:
  PromptSource(int64_t batch, int64_t context) : batch_(batch), context_(context), tokens_(batch * context, 0) {}
  int64_t batch() const override { return batch_; }
  int64_t context() const override { return context_; }
  void micro_batch(int64_t, int32_t* inputs, int32_t* targets) const override {
    std::copy(tokens_.begin(), tokens_.end(), inputs);
    std::fill(targets, targets + batch_ * context_, 0);
  }
  std::string describe() const override { return "sampling prompt"; }
  std::vector<int32_t>& tokens() { return tokens_; }

 private:
  int64_t batch_, context_;
  std::vector<int32_t> tokens_;
};

// The token drawn from logits `row` (vocab of them) by the uniform `u`.
int32_t draw(const float* row, int64_t vocab, double u, std::vector<double>& p) {
  const double top = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += p[static_cast<size_t>(v)] = std::exp(static_cast<double>(row[v]) - top);
  double acc = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    acc += p[static_cast<size_t>(v)] / sum;
    if (u < acc) return static_cast<int32_t>(v);
  }
  return static_cast<int32_t>(vocab - 1);
}

// Puts the model's own source back when sampling ends, also by an error.
class SourceRestore {
 public:
  explicit SourceRestore(Gpt& gpt) : gpt_(gpt), source_(gpt.shared_source()) {}
  ~SourceRestore() {
    gpt_.set_source(source_);
    gpt_.keep_logits_row(-1);
  }
  SourceRestore(const SourceRestore&) = delete;
  SourceRestore& operator=(const SourceRestore&) = delete;

 private:
  Gpt& gpt_;
  std::shared_ptr<const TokenBatchSource> source_;
};

}  // namespace

std::vector<int32_t> gpt_sample(Gpt& gpt, const std::function<void()>& forward, int count, uint64_t seed,
                                int64_t step) {
  const GptConfig& g = gpt.config();
  auto prompt = std::make_shared<PromptSource>(g.micro_batch_size, g.context);
  const int32_t start = g.vocab > 10 ? 10 : 0;
  prompt->tokens()[0] = start;
  const SourceRestore restore(gpt);
  gpt.set_source(prompt);
  const int64_t padded = gpt_padded_vocab(g.vocab);
  std::vector<double> p(static_cast<size_t>(g.vocab));
  std::vector<int32_t> text{start};
  for (int t = 0; t + 1 < count && t + 1 < g.context; ++t) {
    gpt.keep_logits_row(t);
    forward();
    const std::vector<float> logits = gpt.kept_logits();
    MP_ENFORCE_EQ(static_cast<int64_t>(logits.size()), padded, "kept logits");
    const float* row = logits.data();
    const double u = (math::philox_u32(seed, static_cast<uint64_t>(step), static_cast<uint64_t>(t)) + 0.5) / 4294967296.0;
    const int32_t next = draw(row, g.vocab, u, p);
    prompt->tokens()[static_cast<size_t>(t + 1)] = next;
    text.push_back(next);
  }
  return text;
}

std::string gpt_tokens_text(const std::vector<int32_t>& tokens, int64_t vocab) {
  std::string out;
  for (int32_t tok : tokens) {
    if (vocab > 256) {
      out += (out.empty() ? "" : " ") + std::to_string(tok);
    } else if (tok >= 32 && tok < 127) {
      out += static_cast<char>(tok);
    } else if (tok == 10) {
      out += "\\n";
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(tok));
      out += buf;
    }
  }
  return out;
}

}  // namespace mp

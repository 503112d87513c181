// models/gpt_sample.h: text drawn from the GPT (mp_worker's sample_interval).
//
// Note [GPT sampling]
// Sampling runs the model on a prompt: row 0 of a micro-batch holds the
// text so far, the other rows and the targets are zeros (the loss is not
// used). The text starts from token 10 ('\n' in byte-level vocabularies;
// token 0 when vocab <= 10) and grows one token per forward, at temperature
// 1, up to `count` tokens and at most context. Token t is drawn from
// philox_u32(seed, step, t), so every rank draws the same text without
// exchanging it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/gpt.h"

namespace mp {

// `count` tokens from `gpt` (Note [GPT sampling]). `forward` runs the model
// on micro-batch 0 of its source, e.g. engine.evaluate(model, 0, 1) (then
// collective: every rank samples together); the next token comes from
// gpt.kept_logits() after it. The model reads the prompt meanwhile and its
// own source (and no kept row) again after.
std::vector<int32_t> gpt_sample(Gpt& gpt, const std::function<void()>& forward, int count, uint64_t seed,
                                int64_t step);

// Tokens as text: for vocabularies up to 256 bytes as characters (10 as
// "\n", other non-printable bytes as "\xNN"), else token ids separated by
// spaces.
std::string gpt_tokens_text(const std::vector<int32_t>& tokens, int64_t vocab);

}  // namespace mp

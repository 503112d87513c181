// models/gpt_hf.h: our GPT (models/gpt.h) as a Hugging Face transformers
// GPT-2, so a trained model loads with GPT2LMHeadModel.from_pretrained(dir)
// and no conversion code, and GPT-2 weights initialize a run.
//
// Note [GPT-2 names]
// Our parameters and transformers' GPT2Model state dict differ only in names
// and in wte's rows:
//   ours                     Hugging Face              shape
//   wte                      wte.weight                ours [Vp, C], HF [vocab, C]
//   wpe                      wpe.weight                [context, C] (HF: n_positions rows)
//   h{i}.ln_1.weight         h.{i}.ln_1.weight         [C]
//   h{i}.attn.c_attn.weight  h.{i}.attn.c_attn.weight  [C, 3C]
//   ... every block parameter likewise (Conv1D weights are [in, out] in both)
//   ln_f.weight, ln_f.bias   the same                  [C]
// Our wte has gpt_padded_vocab(vocab) rows: export drops the padding rows,
// import sets them to zero. The head is tied to wte in both, so no
// lm_head.weight is written (transformers ties it on load). The GELU is the
// tanh approximation ("gelu_new"), LayerNorm eps 1e-5, attention scaled by
// 1/sqrt(head_dim): the computation is transformers' GPT-2 with dropout 0.
//
// Files: DIR/model.safetensors (formats/safetensors.h) with metadata
// {"format": "pt"} (transformers refuses safetensors files without it) and
// DIR/config.json, a GPT2Config. Import reads the names above with or
// without transformers' "transformer." prefix; it ignores the attention mask
// buffers h.{i}.attn.bias and h.{i}.attn.masked_bias that older checkpoints
// carry, and an lm_head.weight equal to wte.weight (a saved tied copy).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "models/gpt.h"

namespace mp {

// The Hugging Face GPT-2 name of our parameter `name` (Note [GPT-2 names]);
// ConfigError for a name that is not a GPT parameter.
std::string gpt_hf_name(const std::string& name);

// The transformers GPT2Config of `config`, as config.json holds it.
// torch_dtype names `dtype`. bos/eos_token_id are GPT-2's 50256 when vocab
// is GPT-2's 50257, else null (the vocabulary has no known end token).
std::string gpt_hf_config_json(const GptConfig& config, DType dtype);

// Creates `dir` (and its parents) and writes DIR/model.safetensors, every
// parameter in `dtype` (fp32, bf16 or fp16; rounded to nearest even), and
// DIR/config.json, each atomically. weights(name) returns the fp32 values of
// our parameter `name` in our layout (Gpt::spec_for(config)'s shape, wte with
// all Vp rows); a wrong element count is ConfigError naming the parameter.
void export_gpt_hf(const std::string& dir, const GptConfig& config,
                   const std::function<std::vector<float>(const std::string& name)>& weights, DType dtype);

// Reads a GPT-2 from `path_or_dir`: a safetensors file, or a directory
// holding model.safetensors. Returns every parameter of
// Gpt::spec_for(config), by our name, as fp32 values in our layout (wte
// padded with zero rows to Vp). Checks, each a ConfigError naming the file:
// every tensor is present once with the shape the config implies (wpe may
// have more rows than the context, as GPT-2's 1024 positions do; the first
// `context` are used); no tensor of another model or of a layer past
// config.layers; and, where a config.json sits beside the file, that its
// vocab_size, n_embd, n_layer, n_head and activation_function agree.
std::map<std::string, std::vector<float>> import_gpt_hf(const std::string& path_or_dir, const GptConfig& config);

}  // namespace mp

#!/usr/bin/env python3
"""Loads our GPT-2 export with transformers and compares its logits with ours.

Usage: check_hf_export.py EXPORT_DIR LOGITS_JSON [--tolerance 1e-3]

EXPORT_DIR is what models/gpt_hf.h export_gpt_hf writes (model.safetensors
and config.json). LOGITS_JSON holds the tokens our GPT ran on and the logits
it computed (tests/test_gpt_hf.cc, GptHf.TransformersComputesOurLogits-
FromTheExport, writes it):

  {"tokens": [[t, ...], ...],          # [batch][positions] token ids
   "logits": [[[x, ...], ...], ...]}   # [batch][positions][vocab] (the real
                                       # vocabulary only, no padding columns)

The model is loaded with GPT2LMHeadModel.from_pretrained(EXPORT_DIR) in
float32, with no conversion code, and run on the tokens. Prints the max
absolute logit difference and the logits' scale (max |logit|); exits 1 when
the difference exceeds tolerance * max(scale, 1), 2 on bad input, and 77
(CTest's SKIP_RETURN_CODE convention) when torch or transformers cannot be
imported.
"""

import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir")
    parser.add_argument("logits_json")
    parser.add_argument("--tolerance", type=float, default=1e-3,
                        help="allowed max |difference| relative to max(max |logit|, 1)")
    args = parser.parse_args()

    try:
        import torch
        from transformers import GPT2LMHeadModel
    except ImportError as e:
        print(f"check_hf_export: SKIP: cannot import torch and transformers ({e}); "
              "pip install torch transformers safetensors", file=sys.stderr)
        return 77

    with open(args.logits_json) as f:
        expected = json.load(f)
    tokens = torch.tensor(expected["tokens"], dtype=torch.long)
    ours = torch.tensor(expected["logits"], dtype=torch.float64)
    if tokens.dim() != 2 or ours.dim() != 3 or ours.shape[:2] != tokens.shape:
        print(f"check_hf_export: {args.logits_json}: tokens {list(tokens.shape)} and logits {list(ours.shape)} "
              "are not [batch, positions] and [batch, positions, vocab]", file=sys.stderr)
        return 2

    # float32 whatever config.json's torch_dtype says (a bf16 export widens
    # exactly); no dtype argument, whose name changed in transformers 5.
    model = GPT2LMHeadModel.from_pretrained(args.export_dir).float()
    model.eval()
    if model.config.vocab_size != ours.shape[2]:
        print(f"check_hf_export: the export's vocab_size {model.config.vocab_size} differs from the "
              f"{ours.shape[2]} logits per position in {args.logits_json}", file=sys.stderr)
        return 1
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        print("check_hf_export: lm_head is not tied to wte after loading", file=sys.stderr)
        return 1
    with torch.no_grad():
        theirs = model(input_ids=tokens).logits.to(torch.float64)

    diff = (theirs - ours).abs()
    max_diff = diff.max().item()
    scale = ours.abs().max().item()
    worst = tuple(int(i) for i in torch.nonzero(diff == max_diff)[0])
    limit = args.tolerance * max(scale, 1.0)
    print(f"check_hf_export: {tokens.shape[0]}x{tokens.shape[1]} tokens, vocab {ours.shape[2]}: "
          f"max |transformers - mp| logit difference {max_diff:.3e} at {list(worst)} "
          f"(max |logit| {scale:.3f}, relative {max_diff / max(scale, 1.0):.3e}, limit {limit:.3e})")
    if not max_diff <= limit:  # NaN fails
        print("check_hf_export: FAILED: the logits differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

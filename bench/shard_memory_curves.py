#!/usr/bin/env python3
"""bench/shard_memory_curves.py: bytes per rank of mp.torch.shard against world size, beside FSDP2's.

    PYTHONPATH=build/python .venv/bin/python bench/shard_memory_curves.py [--plot docs/shard_memory.png]

For transformers' GPT-2 124M and a 1B-class Llama (2048 channels, 16
layers, 32 heads, 8 key-value heads, MLP 8192, vocabulary 128256, untied
head: 1.50B parameters), both built on the meta device (no memory), AdamW,
FULL_SHARD, recipes fp32 and bf16_master, at world sizes 1 to 1024:

  mp     mp.torch.plan(model, config, world_size): the engine's long-lived
         bytes per rank as its memory plan gives them (equal to the
         measured bytes: CTest python_torch_ranks, at 1, 2 and 4 ranks)
  fsdp2  FSDP2's documented state per rank: 16 bytes a parameter over N
         (fp32 sharded parameters, gradients, and AdamW's two moments),
         plus the unsharded parameters of two units in flight
         (limit_all_gathers) and one unit's unsharded gradient, in the
         param dtype, plus its reduce-scatter input in fp32 where that
         differs, sized by the largest unit (the root: embeddings and head)

Neither counts activations or the framework itself, which are the same for
both. Prints one JSON line per (model, recipe, world size); --plot draws
bytes per rank against world size (needs matplotlib).
"""
import argparse
import json

import torch
import transformers

import mp
import mp.torch

WORLDS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
RECIPES = {"fp32": ("RECIPE_FP32", 4), "bf16_master": ("BF16_MASTER", 2)}


def make(name):
    with torch.device("meta"):
        if name == "gpt2":
            return transformers.GPT2LMHeadModel(transformers.GPT2Config())
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False))


def fsdp2_bytes(params, largest_unit, world, param_bytes):
    unsharded = 2 * largest_unit * param_bytes + largest_unit * param_bytes
    reduce_input = largest_unit * 4 if param_bytes != 4 else 0
    return 16 * params / world + unsharded + reduce_input


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plot", default="")
    args = ap.parse_args()
    rows = []
    for name in ("gpt2", "llama-1b"):
        model = make(name)
        params = sum(p.numel() for p in model.parameters())
        blocks = model.transformer.h if name == "gpt2" else model.model.layers
        in_blocks = {id(p) for b in blocks for p in b.parameters()}
        root = sum(p.numel() for p in model.parameters() if id(p) not in in_blocks)
        largest = max(root, max(sum(p.numel() for p in b.parameters()) for b in blocks))
        for recipe, (config_recipe, param_bytes) in RECIPES.items():
            config = f"sharding {{ strategy: FULL_SHARD }} precision {{ recipe: {config_recipe} }}"
            for world in WORLDS:
                ours = mp.torch.plan(model, config=config, world_size=world)["total"]
                theirs = fsdp2_bytes(params, largest, world, param_bytes)
                row = {"suite": "shard_memory", "model": name, "params": params, "recipe": recipe,
                       "world_size": world, "mp_bytes_per_rank": ours, "fsdp2_bytes_per_rank": round(theirs),
                       "ratio": round(ours / theirs, 3)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, name in zip(axes, ("gpt2", "llama-1b")):
            for recipe, style in (("fp32", "-"), ("bf16_master", "--")):
                mine = [r for r in rows if r["model"] == name and r["recipe"] == recipe]
                ax.plot([r["world_size"] for r in mine], [r["mp_bytes_per_rank"] / 2**30 for r in mine],
                        "C0" + style, marker="o", ms=3, label=f"mp {recipe}")
                ax.plot([r["world_size"] for r in mine], [r["fsdp2_bytes_per_rank"] / 2**30 for r in mine],
                        "C1" + style, marker="s", ms=3, label=f"FSDP2 {recipe}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("ranks")
            ax.set_ylabel("GiB per rank (model state, no activations)")
            ax.set_title(f"{name} ({mine[0]['params'] / 1e6:.0f}M parameters), FULL_SHARD, AdamW")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()

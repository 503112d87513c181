#!/usr/bin/env python3
"""bench/shard_curves.py: mp.torch.shard's bf16_master against PyTorch's autocast, step by step.

    PYTHONPATH=build/python .venv/bin/python bench/shard_curves.py [--steps 60] [--plot docs/shard_bf16.png]

For transformers' GPT2LMHeadModel and LlamaForCausalLM (4 layers, 128
channels, vocabulary 512, built in code, the same seed), B = 8, T = 64, the
synthetic language of examples/torch_gpt2.py, AdamW (lr 1e-3, weight decay
0.1 on 2-D parameters), clipping at 1.0, the same batches, one loop of the
user's each:

  mp     mp.torch.shard, precision { recipe: BF16_MASTER } (bf16 parameters
         and activations, fp32 master and moments, fp32 gradient reduction)
  torch  torch.autocast("cpu", bfloat16) around the forward, fp32 parameters
         and torch.optim.AdamW

Prints one JSON line per model with every step's loss of each, the final
loss (mean of the last 5 steps) of each and their relative difference;
--plot draws both models' curves and their relative difference per step
(needs matplotlib). One rank.
"""
import argparse
import copy
import json

import torch
import transformers

import mp
import mp.torch

B, T, V, LR, WD, CLIP = 8, 64, 512, 1e-3, 0.1, 1.0


def make(name):
    torch.manual_seed(0)
    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=V, n_positions=T, n_embd=128, n_layer=4, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, bos_token_id=V - 1, eos_token_id=V - 1))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=V, hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=T))


def batch(index):
    g = torch.Generator().manual_seed(index)
    tokens = torch.empty(B, T, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, V, (B,), generator=g)
    noise = torch.randint(0, V, (B, T), generator=g)
    noisy = torch.rand(B, T, generator=g) < 0.125
    for t in range(1, T):
        tokens[:, t] = torch.where(noisy[:, t], noise[:, t], (7 * tokens[:, t - 1] + 3) % V)
    return tokens


def run_mp(model, steps):
    sharded = mp.torch.shard(model, config=(
        f"sharding {{ strategy: FULL_SHARD }} precision {{ recipe: BF16_MASTER }} "
        f"optimizer {{ lr: {LR} weight_decay: {WD} grad_clip: {CLIP} }}"))
    losses = []
    for s in range(steps):
        tokens = batch(s)
        model(input_ids=tokens, labels=tokens).loss.backward()
        losses.append(sharded.step().loss)
    sharded.close()
    return losses


def run_torch(model, steps):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}], lr=LR)
    losses = []
    for s in range(steps):
        tokens = batch(s)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(11, 4))
    for r, color in zip(rows, ("tab:blue", "tab:red")):
        steps = range(1, len(r["mp"]) + 1)
        ax.plot(steps, r["torch"], color=color, lw=1, ls="--", label=f"{r['model']}: torch autocast bf16")
        ax.plot(steps, r["mp"], color=color, lw=1, label=f"{r['model']}: mp.torch.shard bf16_master")
        dx.plot(steps, [(a - b) / b for a, b in zip(r["mp"], r["torch"])], color=color, lw=1, label=r["model"])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8)
    dx.axhline(0, color="gray", lw=0.5)
    dx.set_xlabel("step")
    dx.set_ylabel("(mp - torch) / torch")
    dx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--plot", default="")
    args = ap.parse_args()
    mp.init()
    torch.set_num_threads(1)
    rows = []
    for name in ("gpt2", "llama"):
        model = make(name)
        reference = copy.deepcopy(model)
        ours, theirs = run_mp(model, args.steps), run_torch(reference, args.steps)
        final_mp, final_torch = sum(ours[-5:]) / 5, sum(theirs[-5:]) / 5
        worst = max(abs(a - b) / b for a, b in zip(ours, theirs))
        row = {"suite": "shard_curves", "model": name, "steps": args.steps, "final_mp": round(final_mp, 5),
               "final_torch": round(final_torch, 5), "final_rel": round((final_mp - final_torch) / final_torch, 6),
               "worst_step_rel": round(worst, 6), "mp": ours, "torch": theirs}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()

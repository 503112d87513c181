#!/usr/bin/env python3
"""examples/torch_gpt2.py: a Hugging Face GPT-2 trained sharded by mp, from PyTorch.

    mpirun -np 2 python3 examples/torch_gpt2.py [--steps 50] [--recipe BF16_MASTER]

The model is a small transformers.GPT2LMHeadModel built from a config in
code (nothing is downloaded), the same on every rank (seeded), trained in
this script's own loop: model(tokens, labels=tokens).loss.backward(), then
sharded.step(). mp.torch.shard makes each block a unit and the rest (the
embeddings, the final LayerNorm and the head tied to them) the root unit;
mp gathers each unit's bf16 parameters for its forward and backward,
reduce-scatters the gradients (FULL_SHARD) as each unit's backward ends
and runs its fused AdamW on each rank's shard of the fp32 master weights.
The data is a
synthetic language each rank draws from (its own micro-batches): token
t + 1 = 7 token t + 3 (mod vocabulary), one token in eight random, so the
loss falls from ln(vocabulary) towards the noise's entropy. Rank 0 prints
every step; with --checkpoint DIR the run saves there at the end (and
resumes from it when it exists).
"""
import argparse
import os
import time

import torch
import transformers

import mp
import mp.torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--recipe", default="BF16_MASTER", help="mp's precision recipe (docs/precision.md)")
    ap.add_argument("--strategy", default="FULL_SHARD")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--channels", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="sequences per micro-batch (per rank)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: torch's default)")
    ap.add_argument("--checkpoint", default="", help="a checkpoint root to resume from and save to")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    mp.init()
    torch.manual_seed(0)  # the same initial weights on every rank (rank 0's are taken)
    config = transformers.GPT2Config(vocab_size=args.vocab, n_positions=args.context, n_embd=args.channels,
                                     n_layer=args.layers, n_head=max(1, args.channels // 32),
                                     bos_token_id=args.vocab - 1, eos_token_id=args.vocab - 1)
    model = transformers.GPT2LMHeadModel(config)

    def data(index):  # micro-batch `index`: each rank reads its own
        g = torch.Generator().manual_seed(index)
        tokens = torch.empty(args.batch, args.context, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, args.vocab, (args.batch,), generator=g)
        noise = torch.randint(0, args.vocab, (args.batch, args.context), generator=g)
        noisy = torch.rand(args.batch, args.context, generator=g) < 0.125
        for t in range(1, args.context):
            tokens[:, t] = torch.where(noisy[:, t], noise[:, t], (7 * tokens[:, t - 1] + 3) % args.vocab)
        return tokens

    engine_config = (f"sharding {{ strategy: {args.strategy} }} precision {{ recipe: {args.recipe} }} "
                     f"optimizer {{ lr: {args.lr} weight_decay: 0.1 grad_clip: 1.0 "
                     f"schedule {{ warmup_steps: {max(1, args.steps // 10)} total_steps: {args.steps} }} }}")
    sharded = mp.torch.shard(model, config=engine_config)
    lead = mp.rank() == 0
    start = 0
    if args.checkpoint and os.path.exists(os.path.join(args.checkpoint, "latest")):
        start = sharded.load_checkpoint(args.checkpoint)
    if lead:
        params = sum(p.numel() for p in model.parameters())
        print(f"GPT-2 {args.layers} layers x {args.channels} channels, {params / 1e6:.2f}M parameters; "
              f"{mp.world_size()} rank(s), {args.strategy}, {args.recipe}, {sharded.engine.param_dtype} compute; "
              f"steps {start + 1}..{args.steps}", flush=True)
    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        tokens = data((step - 1) * mp.world_size() + mp.rank())
        model(tokens, labels=tokens).loss.backward()
        r = sharded.step()
        if lead:
            print(f"step {step:4d}  loss {r.loss:.4f}  norm {r.grad_norm:.3f}  lr {r.lr:.2e}  "
                  f"{args.batch * args.context * mp.world_size() / (time.perf_counter() - t0):8.0f} tokens/s",
                  flush=True)
    if args.checkpoint:
        path = sharded.save_checkpoint(args.checkpoint)
        if lead:
            print(f"saved {path}")
    sharded.close()


if __name__ == "__main__":
    main()

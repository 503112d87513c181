#!/usr/bin/env python3
"""examples/torch_llama.py: a Hugging Face Llama trained sharded by mp, in your own PyTorch loop.

    torchrun --standalone --nproc-per-node 2 examples/torch_llama.py [--steps 50] [--recipe BF16_MASTER]
    mpirun -np 2 python3 examples/torch_llama.py        # or srun -n 2 python3 examples/torch_llama.py

The model is a small transformers.LlamaForCausalLM (rotary positions,
RMSNorm, grouped-query attention, an untied head) built from a config in
code (nothing is downloaded), the same on every rank (seeded). The loop is
the one you would write for plain PyTorch:

    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    result = sharded.step()

mp.torch.shard makes each decoder layer a unit and the rest (the
embeddings, the final norm, the head) the root unit. Under FULL_SHARD each
rank keeps 1/N of the fp32 master weights and AdamW moments; a layer's
bf16 parameters are gathered just before its forward and again for its
backward, its gradients are reduce-scattered as soon as the backward has
produced them all, and step() runs mp's fused AdamW on each rank's shard.
Each rank reads its own micro-batches of a synthetic language (token t + 1
= 7 token t + 3 (mod vocabulary), one token in eight random). Rank 0
prints every step; --eval-every N also prints a validation loss computed
under torch.no_grad() (gather, run, release).
"""
import argparse
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
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--deterministic", action="store_true",
                    help="mp's deterministic mode: the same bits under any launcher and rank count")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: torch's default)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    mp.init()
    torch.manual_seed(0)  # the same initial weights on every rank (rank 0's are taken)
    heads = max(2, args.channels // 32)
    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.channels,
                                      intermediate_size=4 * args.channels, num_hidden_layers=args.layers,
                                      num_attention_heads=heads, num_key_value_heads=heads // 2,
                                      max_position_embeddings=args.context)
    model = transformers.LlamaForCausalLM(config)

    def data(index):  # micro-batch `index`: each rank reads its own
        g = torch.Generator().manual_seed(index)
        tokens = torch.empty(args.batch, args.context, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, args.vocab, (args.batch,), generator=g)
        noise = torch.randint(0, args.vocab, (args.batch, args.context), generator=g)
        noisy = torch.rand(args.batch, args.context, generator=g) < 0.125
        for t in range(1, args.context):
            tokens[:, t] = torch.where(noisy[:, t], noise[:, t], (7 * tokens[:, t - 1] + 3) % args.vocab)
        return tokens

    sharded = mp.torch.shard(model, config=(
        f"sharding {{ strategy: {args.strategy} }} precision {{ recipe: {args.recipe} }} "
        f"deterministic: {'true' if args.deterministic else 'false'} "
        f"optimizer {{ lr: {args.lr} weight_decay: 0.1 grad_clip: 1.0 "
        f"schedule {{ warmup_steps: {max(1, args.steps // 10)} total_steps: {args.steps} }} }}"))
    lead = mp.rank() == 0
    if lead:
        params = sum(p.numel() for p in model.parameters())
        print(f"Llama {args.layers} layers x {args.channels} channels, {heads} heads ({heads // 2} key-value), "
              f"{params / 1e6:.2f}M parameters; {mp.world_size()} rank(s), {args.strategy}, {args.recipe}",
              flush=True)
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        model.train()
        tokens = data((step - 1) * mp.world_size() + mp.rank())
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        r = sharded.step()
        line = (f"step {step:4d}  loss {r.loss:.4f}  norm {r.grad_norm:.3f}  lr {r.lr:.2e}  "
                f"{args.batch * args.context * mp.world_size() / (time.perf_counter() - t0):8.0f} tokens/s")
        if args.eval_every and step % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                held_out = data(10**9 + mp.rank())
                line += f"  val {model(input_ids=held_out, labels=held_out).loss.item():.4f} (rank 0's)"
        if lead:
            print(line, flush=True)
    sharded.close()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""bench/torch_gpt.py: the reference for `mp_bench gpt`: the same GPT-2 124M
(vocab 50257 padded to 50304 as llm.c pads it, context = T = 64, 12 layers,
12 heads, 768 channels, tied head, GELU tanh, pre-LN) trained with AdamW in
PyTorch on the CPU, batch 4 x 64 tokens, in fp32, under
torch.autocast("cpu", dtype=torch.bfloat16), and in explicit bf16
(model.to(torch.bfloat16)), on the same number of threads.
Prints one JSON line per case, mp_bench style:

  {"suite": "torch_gpt", "case": "gpt2_124m_amp_bf16", "value": 151.2,
   "unit": "tokens/s", ...}

and, given mp_bench's output (--ours FILE: the JSON lines of
`launch/mprun -np N --bind-to none build/mp_bench gpt`, one or several N),
one line per GPT-2 row of ours: its tokens/s over the better of PyTorch's
fp32, autocast bf16 and explicit bf16 (the whole model and AdamW in bf16:
mode bf16), and over PyTorch's same-precision case (bf16_master against
autocast bf16, fp32 against fp32).

On a GPU (--device cuda; scripts/gpu_check runs it so): the same model at
--seq 1024, modes amp_bf16 (eager torch.autocast("cuda", bfloat16), fused
AdamW) and amp_bf16_compile (the same under torch.compile, where it works;
a mode that fails prints a JSON line with "error" instead), timed with
torch.cuda.synchronize() around each step, at each batch of --batch (4,16:
every mode at 4, then at 16). The optimizer step is mp's: AdamW with
weight decay on the 2-D parameters only, and with --clip C the gradients'
global norm clipped at C first, as configs/gpt2_124m.textproto does
(grad_clip 1.0; scripts/gpu_check passes --clip 1.0).

Needs torch (pip install torch); nothing in the build or the tests does.
Usage:
  python3 bench/torch_gpt.py [--threads N] [--steps 5] [--warmup 2] [--ours gpt.jsonl]
  python3 bench/torch_gpt.py --device cuda --seq 1024 --batch 4,16 --clip 1.0 --modes amp_bf16,amp_bf16_compile
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c, eps=1e-5)
        self.c_attn = nn.Linear(c, 3 * c)
        self.attn_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c, eps=1e-5)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab=50257, context=64, c=768, heads=12, layers=12):
        super().__init__()
        self.vocab = vocab
        padded = (vocab + 127) // 128 * 128
        self.wte = nn.Embedding(padded, c)
        self.wpe = nn.Embedding(context, c)
        self.h = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c, eps=1e-5)
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if "proj" in name else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the tied head
        logits = logits[..., : self.vocab].float()
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))


def flops_per_token(model, context):
    """nanoGPT's and llm.c's estimate 6 N + 12 L C T, as mp_bench gpt counts it
    (models/gpt.h gpt_train_flops_per_token): N the model's parameters without
    wpe and without the vocabulary padding."""
    c = model.wpe.weight.shape[1]
    padding = (model.wte.weight.shape[0] - model.vocab) * c
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel() - padding
    return 6 * n + 12 * len(model.h) * c * context


def run(mode, batch, args):
    torch.manual_seed(0)
    dev = torch.device(args.device)
    model = Gpt(context=args.seq).to(dev)
    if mode == "bf16":  # explicit bf16: weights, gradients and AdamW's states all bf16
        model = model.to(torch.bfloat16)
    fused = {"fused": True} if dev.type == "cuda" else {}
    # mp's AdamW (optim/optimizer.cc): 1-D parameters (biases, LayerNorm) are not decayed.
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=1e-4, **fused)
    step_model = torch.compile(model) if mode.endswith("_compile") else model
    gen = torch.Generator().manual_seed(1)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times = []
    for step in range(args.warmup + args.steps):
        idx = torch.randint(0, 50257, (batch, args.seq), generator=gen).to(dev)
        targets = torch.randint(0, 50257, (batch, args.seq), generator=gen).to(dev)
        sync()
        t0 = time.perf_counter()
        if mode.startswith("amp_bf16"):
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = step_model(idx, targets)
        else:
            loss = step_model(idx, targets)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip, foreach=dev.type == "cuda")
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    tokens = batch * args.seq
    return {
        "suite": "torch_gpt",
        "case": f"gpt2_124m_{mode}",
        "value": round(tokens / step_s, 2),
        "unit": "tokens/s",
        "better": "higher",
        "step_ms": round(step_s * 1e3, 2),
        "best_tokens_per_s": round(tokens / min(times), 2),
        "model_gflops": round(flops_per_token(model, args.seq) * tokens / step_s / 1e9, 2),
        "loss": round(loss.item(), 4),
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "batch": batch,
        "seq": args.seq,
        "clip": args.clip,
        "fused_adamw": bool(fused),
        "steps": args.steps,
        "torch": torch.__version__,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--batch", default="4", help="the batch, or several: 4,16")
    ap.add_argument("--clip", type=float, default=0.0, help="clip the gradients' global norm at this (0: no clipping)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--modes", default="fp32,amp_bf16,bf16",
                    help="fp32; amp_bf16 (autocast); bf16 (the model in bf16, AdamW on bf16 states); _compile suffix")
    ap.add_argument("--ours", help="mp_bench gpt output (JSON lines) to compare with")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ours = []
    if args.ours:
        with open(args.ours) as f:
            for line in f:
                if line.startswith("{"):
                    row = json.loads(line)
                    if row.get("suite") == "gpt":
                        ours.append(row)
    rows = {}
    batches = [int(b) for b in str(args.batch).split(",")]
    for batch in batches:
        for mode in args.modes.split(","):
            try:
                row = run(mode, batch, args)
            except Exception as e:  # torch.compile may not work everywhere: say so, go on
                print(json.dumps({"suite": "torch_gpt", "case": f"gpt2_124m_{mode}", "batch": batch,
                                  "error": f"{type(e).__name__}: {e}"[:500]}), flush=True)
                continue
            print(json.dumps(row), flush=True)
            if batch == batches[0]:
                rows[mode] = row
    if not rows:
        return 1
    best_mode = max(rows, key=lambda m: rows[m]["value"])
    same = {"gpt2_124m_fp32": "fp32", "gpt2_124m_bf16_master": "amp_bf16"}
    for mine in ours:
        if mine["case"] not in same:
            continue
        layout = f'{mine["ranks"]}x{mine["threads_per_rank"]}'
        row = {
            "suite": "torch_gpt",
            "case": f'ratio_{mine["case"]}_{layout}',
            "value": round(mine["tokens_per_s"] / rows[best_mode]["value"], 3),
            "unit": "ratio",
            "better": "higher",
            "ours_tokens_per_s": mine["tokens_per_s"],
            "ours_ranks": mine["ranks"],
            "ours_threads_per_rank": mine["threads_per_rank"],
            "ref": "torch_gpt2_124m_" + best_mode,
            "ref_value": rows[best_mode]["value"],
        }
        if same[mine["case"]] in rows:
            ref = rows[same[mine["case"]]]
            row["same_precision_ref"] = ref["case"]
            row["ours_over_same_precision"] = round(mine["tokens_per_s"] / ref["value"], 3)
        print(json.dumps(row), flush=True)
        print(f'# {mine["case"]} {layout}: {mine["tokens_per_s"]} tokens/s = {row["value"]} x PyTorch\'s best '
              f'({best_mode}, {rows[best_mode]["value"]} tokens/s)', file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""bench/torch_sharded.py: mp.torch.shard against PyTorch on the same machine, in one run.

    python3 bench/torch_sharded.py [--model gpt2|gpt2-24|llama|all] [--cases plain,mp1,ddp2,fsdp2,mp2]
                                   [--batch 4] [--steps 8] [--warmup 2] [--out FILE]

GPT-2 124M (transformers.GPT2LMHeadModel's default config, built in code),
the same with 24 layers (gpt2-24, 209M) and a Llama of similar size (768
channels, 12 layers, 12 heads, 4 key-value heads, MLP 2048, vocabulary
32000: 134M parameters), B = 4 per rank (--batch), T = 64, AdamW
(weight decay 0.1 on 2-D parameters), clipping at 1.0, random tokens, the
same loop of the user's in every case (model(tokens), the loss,
loss.backward(), the step). Each case runs as its own job, one after the
other:

  plain      PyTorch, 1 process x all cores: fp32, and autocast bf16
  mp1        mp.torch.shard, 1 rank x all cores: fp32, and bf16_master
  ddp2       torch DDP over gloo, 2 processes x 1 thread: fp32, and autocast bf16
  fsdp2      FSDP2 (fully_shard on each block, then the root) over gloo, 2
             processes x 1 thread: fp32, and MixedPrecisionPolicy(param_dtype
             bf16, reduce_dtype fp32) for bf16
  mp2        mp.torch.shard FULL_SHARD, 2 ranks x 1 thread: fp32, and bf16_master

Tokens/s is the median over the timed steps of (tokens of the step, all
ranks) / (its wall time on rank 0); peak_rss_mib is the largest peak
resident set (ru_maxrss) of the case's ranks, model and data included.
Prints one JSON line per case, then the ratios: mp2 / ddp2, mp2 / fsdp2
(tokens/s and peak RSS) and mp1 / plain, like for like (fp32 with fp32; mp's
bf16_master, where the model computes in bf16, with autocast bf16) and
against PyTorch's better mode. One case runs in a job as

    launch/mprun -np N python3 bench/torch_sharded.py --case NAME --precision P
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
T, LR, WD, CLIP = 64, 6e-4, 0.1, 1.0
B = 4  # per rank (--batch)


def model_and_data(name, seed=0):
    import torch
    import transformers
    torch.manual_seed(seed)
    if name == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
            num_key_value_heads=4, max_position_embeddings=T))
    else:
        layers = 24 if name == "gpt2-24" else 12
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0,
                                                                     attn_pdrop=0.0, n_layer=layers))
    vocab = model.config.vocab_size

    def data(index):
        g = torch.Generator().manual_seed(index)
        return torch.randint(0, vocab, (B, T), generator=g)
    return model, data


def loss_of(logits, tokens):
    import torch
    v = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, v).float(), tokens[:, 1:].reshape(-1))


def torch_optimizer(model):
    import torch
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}], lr=LR)


def fully_shard(model, world, bf16):
    """FSDP2: fully_shard on each block, then on the root."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.fsdp import fully_shard as shard_module
    mesh = init_device_mesh("cpu", (world,))
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    kw = {"mesh": mesh} | ({"mp_policy": mixed} if mixed else {})
    blocks = model.model.layers if hasattr(model, "model") else model.transformer.h
    for block in blocks:
        shard_module(block, **kw)
    shard_module(model, **kw)
    return model


def run_torch(args, rank, world):
    """plain (world 1), DDP or FSDP2 over gloo."""
    import torch
    model, data = model_and_data(args.model)
    net = model
    bf16 = args.precision == "bf16"
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)
        if args.case == "fsdp2":
            net = fully_shard(model, world, bf16)
        else:
            net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch_optimizer(model)
    autocast = bf16 and args.case != "fsdp2"  # FSDP2 computes in its param_dtype
    times = []
    for step in range(args.warmup + args.steps):
        tokens = data(step * world + rank)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = net(tokens).logits
        loss = loss_of(logits, tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times[args.warmup:], float(loss)


def run_mp(args):
    import mp
    import mp.torch
    mp.init()
    model, data = model_and_data(args.model)
    recipe = "RECIPE_FP32" if args.precision == "fp32" else "BF16_MASTER"
    config = (f"sharding {{ strategy: FULL_SHARD }} precision {{ recipe: {recipe} }} "
              f"optimizer {{ lr: {LR} weight_decay: {WD} grad_clip: {CLIP} }}")
    sharded = mp.torch.shard(model, config=config)
    times = []
    loss = 0.0
    for step in range(args.warmup + args.steps):
        tokens = data(step * mp.world_size() + mp.rank())
        t0 = time.perf_counter()
        step_loss = loss_of(model(tokens).logits, tokens)
        step_loss.backward()
        sharded.note_loss(step_loss)
        loss = sharded.step().loss
        times.append(time.perf_counter() - t0)
    sharded.close()
    return times[args.warmup:], loss, mp.rank(), mp.world_size()


def one_case(args):
    global B
    B = args.batch
    import torch
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if args.case.startswith("mp"):
        times, loss, rank, world = run_mp(args)
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        times, loss = run_torch(args, rank, world)
    # Every rank's peak resident set, a line each (the driver takes the largest).
    os.write(1, (json.dumps({"rank": rank, "peak_rss_mib": round(peak_rss_mib(), 1)}) + "\n").encode())
    if rank == 0:
        step_s = statistics.median(times)
        sys.stdout.flush()
        os.write(1, (json.dumps({"suite": "torch_sharded", "model": args.model, "case": f"{args.case}_{args.precision}",
                          "world": world, "batch": B,
                          "threads": torch.get_num_threads(), "tokens_per_s": round(B * T * world / step_s, 1),
                          "step_ms": round(1000 * step_s, 1), "steps": len(times), "final_loss": round(loss, 4),
                          "torch": torch.__version__}) + "\n").encode())


def peak_rss_mib():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def driver(args):
    cores = len(os.sched_getaffinity(0))
    every = {"plain": (1, cores), "mp1": (1, cores), "ddp2": (2, 1), "fsdp2": (2, 1), "mp2": (2, 1)}
    cases = [(name, *every[name]) for name in args.cases.split(",")]
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        print("# this PyTorch has no FSDP2 (torch.distributed.fsdp.fully_shard): the fsdp2 case is skipped", flush=True)
        cases = [c for c in cases if c[0] != "fsdp2"]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    print(f"# {cpu}, {cores} cores, {' '.join(isa)}", flush=True)
    out = []
    for model in (("gpt2", "gpt2-24", "llama") if args.model == "all" else (args.model,)):
        rows = {}
        for name, np_, threads in cases:
            for precision in ("fp32", "bf16"):
                cmd = [os.path.join(ROOT, "launch", "mprun"), "-np", str(np_), "--bind-to", "none", sys.executable,
                       os.path.abspath(__file__), "--case", name, "--precision", precision, "--threads",
                       str(threads), "--steps", str(args.steps), "--warmup", str(args.warmup), "--model", model,
                       "--batch", str(args.batch)]
                p = subprocess.run(cmd, capture_output=True, text=True)
                lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
                row = next((r for r in lines if "case" in r), None)
                if p.returncode != 0 or row is None:
                    sys.stderr.write(p.stdout + p.stderr)
                    sys.exit(f"torch_sharded: {model} case {name} {precision} failed (exit {p.returncode})")
                rss = [r["peak_rss_mib"] for r in sorted(lines, key=lambda r: r.get("rank", -1)) if "rank" in r]
                row.update(peak_rss_mib=max(rss), rss_per_rank_mib=rss)
                print(json.dumps(row), flush=True)
                rows[(name, precision)] = row
        out += list(rows.values())
        for ours, theirs in (("mp2", "ddp2"), ("mp2", "fsdp2"), ("mp1", "plain")):
            if (ours, "fp32") not in rows or (theirs, "fp32") not in rows:
                continue
            best = max(rows[(theirs, p)]["tokens_per_s"] for p in ("fp32", "bf16"))
            for precision in ("fp32", "bf16"):
                r, t = rows[(ours, precision)], rows[(theirs, precision)]
                ratio = {"suite": "torch_sharded", "model": model, "case": f"{ours}_{precision}_over_{theirs}",
                         "like_for_like": round(r["tokens_per_s"] / t["tokens_per_s"], 3),
                         "over_best_torch": round(r["tokens_per_s"] / best, 3),
                         "peak_rss_ratio": round(r["peak_rss_mib"] / t["peak_rss_mib"], 3)}
                print(json.dumps(ratio), flush=True)
                out.append(ratio)
    if args.out:
        with open(args.out, "w") as f:
            for row in out:
                f.write(json.dumps(row) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", help="plain, ddp2, fsdp2, mp1 or mp2 (one job); none: the --cases")
    ap.add_argument("--cases", default="plain,mp1,ddp2,fsdp2,mp2", help="the cases the driver runs, in order")
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--model", default="all", choices=["gpt2", "gpt2-24", "llama", "all"])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    one_case(args) if args.case else driver(args)


if __name__ == "__main__":
    main()

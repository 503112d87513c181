"""One rank's part of the multi-rank mp.torch checks (python/tests/check_ranks.py
runs it under launch/mprun):

  torch_ranks.py train --micro-batches K --steps N --out FILE
      the small GPT-2 of gpt2_case.py, FULL_SHARD, fp32, deterministic; rank 0
      writes every step's loss and norm and a hash of the final weights.
  torch_ranks.py raise --rank R --step S
      unit 1's forward raises ValueError on rank R in step S: every rank must
      get mp.ModelError at once (rank R its own, the others naming rank R and
      the traceback); each rank prints "rank r: ModelError as expected".
"""
import argparse
import hashlib
import json
import sys
import time

import torch

import gpt2_case as case
import mp
import mp.torch


def train(args):
    trainer = case.sharded(case.make_model(), micro_batches=args.micro_batches)
    results = [trainer.step() for _ in range(args.steps)]
    digest = hashlib.sha256()
    for u in range(trainer.engine.num_units):
        digest.update(trainer.engine.gather_master(u).tobytes())
    if mp.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"world_size": mp.world_size(), "micro_batches": args.micro_batches,
                       "losses": [r.loss.hex() for r in results], "norms": [r.grad_norm.hex() for r in results],
                       "weights_sha256": digest.hexdigest()}, f)
    trainer.close()


def raise_in_forward(args):
    model = case.make_model()
    units = mp.torch.gpt2_units(model)
    steps = {"now": 0}
    inner = units[1].forward

    def forward(x):
        if mp.rank() == args.rank and steps["now"] == args.step:
            raise ValueError(f"boom on rank {args.rank}")
        return inner(x)
    units[1].forward = forward
    trainer = mp.torch.Sharded(units, loss=mp.torch.causal_lm_loss, data=case.batch, config=case.config_text(),
                               root=model)
    for s in range(1, args.step + 1):
        steps["now"] = s
        t0 = time.monotonic()
        try:
            trainer.step()
        except mp.ModelError as e:
            text = str(e)
            want = ["ValueError: boom on rank", "Traceback"]
            if mp.rank() != args.rank:
                want.append(f"step {s} failed on rank {args.rank}")
            missing = [w for w in want if w not in text]
            if s != args.step or missing or not e.agreed:
                sys.exit(f"rank {mp.rank()}: unexpected error at step {s} (missing {missing}): {text}")
            print(f"rank {mp.rank()}: ModelError as expected after {time.monotonic() - t0:.2f} s", flush=True)
            trainer.close()
            return
    sys.exit(f"rank {mp.rank()}: no error")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("train")
    t.add_argument("--micro-batches", type=int, default=1)
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--out", required=True)
    r = sub.add_parser("raise")
    r.add_argument("--rank", type=int, default=1)
    r.add_argument("--step", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the same bits on every rank count (threads can change a GEMM's)
    mp.init()
    train(args) if args.what == "train" else raise_in_forward(args)


if __name__ == "__main__":
    main()

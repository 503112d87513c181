"""One rank's part of the multi-rank mp.torch checks (tests/python/check_ranks.py
runs it under launch/mprun):

  torch_ranks.py train --model M --micro-batches K --steps N --out FILE [--muon]
                       [--save-at S --checkpoint DIR | --resume DIR]
      one of gpt2_case.py's models through mp.torch.shard in this script's
      own loop (rank r's backward m of step s on micro-batch
      s * W * K + m * W + r), FULL_SHARD, fp32, deterministic; rank 0 writes
      every step's loss and norm and a hash of the final weights, the
      engine's memory as measured and as its plan predicts it at 1, 2 and 4
      ranks (mp.torch.plan, no engine), and whether full_state_dict(
      rank0_only=True) gave rank 0 the whole dict and the others none. --save-at
      saves a checkpoint after step S; --resume starts from one (saved on
      any world size) and runs the steps after it. --muon: optimizer kind
      MUON (gpt2_case.muon_config_text; shard()'s default Muon choice).
  torch_ranks.py kill --rank R --step S
      rank R kills itself (SIGKILL) in step S's backward, as a crashed or
      OOM-killed rank dies: every other rank must get an mp.Error naming
      rank R within the collective timeout (5 s here), and prints
      "rank r: <error> as expected after T s: <message>".
  torch_ranks.py skip --rank R --step S
      rank R runs step S's forward but not its backward, then step(): its
      peers wait for reductions it never issues. Every rank must get an
      mp.Error naming another rank within the collective timeout (5 s
      here), not hang, and each prints "rank r: <error> as expected" (the
      job then ends abnormally: a timed-out rank cannot finalize MPI).

Every mode runs under any launcher mp.init() knows: launch/mprun, torchrun
(python -m torch.distributed.run) or srun; train's output names the
launcher, the data plane and whether MPI was initialised in the process.
"""
import argparse
import hashlib
import json
import os
import signal
import sys
import time

import torch

import gpt2_case as case
import mp
import mp.torch


def train(args):
    model = case.make(args.model)
    config = (case.muon_config_text if args.muon else case.config_text)(micro_batches=args.micro_batches,
                                                                          recipe=args.recipe)
    sharded = mp.torch.shard(model, config=config)
    W, r, k = mp.world_size(), mp.rank(), args.micro_batches
    first = sharded.load_checkpoint(args.resume) if args.resume else 0
    results = []
    for s in range(first, args.steps):
        for m in range(k):
            case.forward(model, s * W * k + m * W + r).backward()
        results.append(sharded.step())
        if args.save_at == s + 1:
            sharded.save_checkpoint(args.checkpoint)
    digest = hashlib.sha256()
    for u in range(sharded.engine.num_units):
        digest.update(sharded.engine.gather_master(u).tobytes())
    measured = sharded.memory()["engine"]
    plans = {w: mp.torch.plan(case.make(args.model), config=config, world_size=w) for w in (1, 2, 4)}
    whole, mine = sharded.full_state_dict(), sharded.full_state_dict(rank0_only=True)
    rank0_only = (all(torch.equal(mine[n], t) for n, t in whole.items()) and mine.keys() == whole.keys()
                  if mp.rank() == 0 else mine == {})
    if mp.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"launcher": mp.launcher(), "data_plane": mp.data_plane(),
                       "mpi_initialized": mp._mp.mpi_initialized(), "world_size": W, "micro_batches": k,
                       "first": first,
                       "losses": [x.loss.hex() for x in results], "norms": [x.grad_norm.hex() for x in results],
                       "weights_sha256": digest.hexdigest(), "memory": measured, "plan": sharded.plan(),
                       "plans": plans, "rank0_only": rank0_only}, f)
    sharded.close()


def skip_a_backward(args):
    model = case.make_model()
    timeout = 5
    sharded = mp.torch.shard(model, config=case.config_text(extra=f"comm {{ timeout_s: {timeout} }}"))
    for s in range(1, args.step + 1):
        t0 = time.monotonic()
        try:
            loss = case.forward(model, s)
            if not (mp.rank() == args.rank and s == args.step):
                loss.backward()
            sharded.step()
        except mp.Error as e:
            waited = time.monotonic() - t0
            text = str(e)
            named = [r for r in range(mp.world_size()) if r != mp.rank() and f"rank {r}" in text]
            if s != args.step or not named or waited > 3 * timeout:
                sys.exit(f"rank {mp.rank()}: unexpected error at step {s} after {waited:.1f} s: {text}")
            print(f"rank {mp.rank()}: {type(e).__name__} as expected after {waited:.2f} s", flush=True)
            # A rank whose collective timed out leaves MPI unfinalized (its
            # calls may never return), which ends the job: give the peers
            # the time to report theirs first.
            time.sleep(2 * timeout)
            return
    sys.exit(f"rank {mp.rank()}: no error")


def kill_a_rank(args):
    model = case.make_model()
    timeout = 5
    sharded = mp.torch.shard(model, config=case.config_text(extra=f"comm {{ timeout_s: {timeout} }}"))
    for s in range(1, args.step + 1):
        t0 = time.monotonic()
        try:
            loss = case.forward(model, s)
            if mp.rank() == args.rank and s == args.step:
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            sharded.step()
        except mp.Error as e:
            waited = time.monotonic() - t0
            text = str(e)
            if s != args.step or f"rank {args.rank}" not in text or waited > 3 * timeout:
                sys.exit(f"rank {mp.rank()}: unexpected error at step {s} after {waited:.1f} s: {text}")
            print(f"rank {mp.rank()}: {type(e).__name__} as expected after {waited:.2f} s: {text}", flush=True)
            os._exit(3)  # the job failed: leave without finalizing a world a peer left
    sys.exit(f"rank {mp.rank()}: no error")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("train")
    t.add_argument("--micro-batches", type=int, default=1)
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--out", required=True)
    t.add_argument("--model", default="gpt2")
    t.add_argument("--save-at", type=int, default=0)
    t.add_argument("--checkpoint", default="")
    t.add_argument("--resume", default="")
    t.add_argument("--muon", action="store_true")
    t.add_argument("--recipe", default="RECIPE_FP32")
    for name in ("skip", "kill"):
        r = sub.add_parser(name)
        r.add_argument("--rank", type=int, default=1)
        r.add_argument("--step", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the same bits on every rank count (threads can change a GEMM's)
    mp.init()
    {"train": train, "skip": skip_a_backward, "kill": kill_a_rank}[args.what](args)


if __name__ == "__main__":
    main()

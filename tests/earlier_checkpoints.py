#!/usr/bin/env python3
"""tests/earlier_checkpoints.py MPRUN WORKER DIR [--write]: checkpoints an
earlier build of mp wrote load into WORKER, and the steps after the resume
give the writing run's losses and gradient norms, bit for bit.

tests/data/earlier_checkpoints/ holds one case per optimizer kind, each
written by mp 0.1.0 at commit 44e8081 on 2 ranks: config.textproto (a tiny
GPT, FULL_SHARD), step_00000004/ (the checkpoint of its step 4) and
losses.txt (steps 5 to 8 of the writing run, "step loss grad_norm" as
Python's repr prints them). The cases cover the two state layouts: MUON
under BF16_MASTER (master, param, state0, and a state1 its matrices keep
nothing of) and SGD with momentum under FP32 (master, state0).

Every run holds oneDNN to AVX2 (ONEDNN_MAX_CPU_ISA) and one thread per rank,
so the GEMMs' bits do not depend on the CPU's wider vector units. --write
makes the cases again with WORKER (the earlier build); every run is in DIR.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

DATA = pathlib.Path(__file__).resolve().parent / "data" / "earlier_checkpoints"
CASES = {
    "muon": """model { gpt { vocab: 16 context: 8 channels: 8 heads: 2 layers: 1 } }
data { micro_batch_size: 2 seed: 7 }
engine {
  sharding { strategy: FULL_SHARD }
  precision { recipe: BF16_MASTER }
  optimizer { kind: MUON lr: 0.02 schedule { warmup_steps: 2 total_steps: 8 min_lr: 0.002 } muon { adamw_lr: 0.01 } }
  seed: 3
}
log_interval: 1
""",
    "sgd": """model { gpt { vocab: 16 context: 8 channels: 8 heads: 2 layers: 1 } }
data { micro_batch_size: 2 seed: 7 }
engine {
  sharding { strategy: FULL_SHARD }
  precision { recipe: RECIPE_FP32 }
  optimizer { kind: SGD lr: 0.1 momentum: 0.9 nesterov: true weight_decay: 0.01 }
  seed: 3
}
log_interval: 1
""",
}
ENV = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", MP_NUM_THREADS="1")


def run(mprun, worker, args, log):
    with open(log, "w") as out:
        done = subprocess.run([mprun, "-np", "2", "--bind-to", "none", worker, *args], env=ENV, stdout=out,
                              stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.exit(f"FAIL: {worker} {' '.join(args)} exited {done.returncode}:\n{pathlib.Path(log).read_text()}")


def losses(metrics, first):
    rows = [json.loads(line) for line in open(metrics)]
    return "".join(f"{r['step']} {r['loss']!r} {r['grad_norm']!r}\n" for r in rows if r["step"] >= first)


def write(mprun, worker, out):
    for name, config in CASES.items():
        case = DATA / name
        shutil.rmtree(case, ignore_errors=True)
        case.mkdir(parents=True)
        (case / "config.textproto").write_text(config)
        run(mprun, worker, [str(case / "config.textproto"), "--steps", "8", "--out", str(out / f"{name}_run"),
                            "--set", "checkpoint.interval_steps=4"], out / f"{name}.log")
        shutil.copytree(out / f"{name}_run" / "checkpoints" / "step_00000004", case / "step_00000004")
        (case / "losses.txt").write_text(losses(out / f"{name}_run" / "metrics.jsonl", 5))


def check(mprun, worker, out):
    for name in CASES:
        case = DATA / name
        run(mprun, worker, [str(case / "config.textproto"), "--steps", "8", "--out", str(out / name),
                            "--resume", str(case / "step_00000004")], out / f"{name}.log")
        got, want = losses(out / name / "metrics.jsonl", 5), (case / "losses.txt").read_text()
        if got != want:
            sys.exit(f"FAIL: {name}: steps 5-8 after the resume\n{got}differ from the writing run's\n{want}")
        print(f"{name}: steps 5-8 after resuming the earlier build's checkpoint equal its run's, bit for bit")


def main():
    mprun, worker, out = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (write if "--write" in sys.argv[4:] else check)(mprun, worker, out)


if __name__ == "__main__":
    main()

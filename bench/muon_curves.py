#!/usr/bin/env python3
"""bench/muon_curves.py: Muon + AdamW against AdamW alone on mp_worker's default GPT.

    .venv/bin/python bench/muon_curves.py build/mp_worker [--steps 300] [--plot docs/muon_adamw.png]

Trains the embedded default (configs/default.textproto: a 4-layer GPT, 128
channels, on the synthetic language; bf16_master; 300 steps, warmup 20,
cosine decay to lr / 10) six times on one rank, each lr swept over three
values:

  adamw  kind ADAMW, lr 1e-3, 3e-3 (the default), 1e-2
  muon   kind MUON (the blocks' matrices; bf16 Newton-Schulz), lr 0.005,
         0.01, 0.02; the other parameters' AdamW at the default's 3e-3 and
         weight decay 0.1, as the AdamW runs

and the same batches, validation batches and initial weights (the config's
seeds). Prints one JSON line per run with its validation losses by step
(val_interval 20) and the final one, then each optimizer's best final
validation loss; --plot draws the validation curves (needs matplotlib).
"""
import argparse
import json
import os
import subprocess
import tempfile

RUNS = [("adamw", 1e-3), ("adamw", 3e-3), ("adamw", 1e-2), ("muon", 0.005), ("muon", 0.01), ("muon", 0.02)]


def run(worker, kind, lr, steps, out):
    args = [worker, "--steps", str(steps), "--out", out, "--set", f"engine.optimizer.lr={lr}",
            "--set", f"engine.optimizer.schedule.total_steps={steps}",
            "--set", f"engine.optimizer.schedule.min_lr={lr / 10}", "--set", "val_interval=20"]
    if kind == "muon":
        args += ["--set", "engine.optimizer.kind=MUON", "--set", "engine.optimizer.muon.adamw_lr=3e-3",
                 "--set", "engine.optimizer.muon.adamw_weight_decay=0.1"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    val = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("val_loss") is not None:
                val[j["step"]] = j["val_loss"]
    return val


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("worker", help="the mp_worker binary")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--plot", help="write the validation curves to this PNG")
    a = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (kind, lr) in enumerate(RUNS):
            val = run(a.worker, kind, lr, a.steps, os.path.join(tmp, str(i)))
            final = val[max(val)]
            results.append((kind, lr, val, final))
            print(json.dumps({"optimizer": kind, "lr": lr, "final_val_loss": final,
                              "val_loss": {str(k): v for k, v in sorted(val.items())}}), flush=True)
    for kind in ("adamw", "muon"):
        best = min((r for r in results if r[0] == kind), key=lambda r: r[3])
        print(json.dumps({"optimizer": kind, "best_lr": best[1], "best_final_val_loss": best[3]}))
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for kind, lr, val, _ in results:
            steps = sorted(val)
            ax.plot(steps, [val[s] for s in steps], ("-" if kind == "adamw" else "--"),
                    label=f"{'Muon + AdamW' if kind == 'muon' else 'AdamW'}, lr {lr:g}")
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss (nats)")
        ax.set_ylim(top=min(4.0, ax.get_ylim()[1]))
        ax.set_title(f"mp_worker's default GPT, {a.steps} steps, one rank")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)


if __name__ == "__main__":
    main()

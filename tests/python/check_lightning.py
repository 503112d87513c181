"""mp.lightning.MPStrategy (CTest python_lightning): Lightning's Trainer on 2
CPU devices (its own launcher starts rank 1) training lightning_case.py's
LightningModule around a transformers Llama:

- fp32, deterministic: every step's loss and gradient norm equal the plain
  mp.torch.shard loop's bit for bit (1 rank, the 2 ranks' micro-batches as
  2 backwards a step), with configure_optimizers' lr scheduler driving
  mp's lr;
- a checkpoint Lightning saved at the end of epoch 1 resumes into a fresh
  Trainer: its steps equal the uninterrupted run's bit for bit;
- bf16_master trains (the loss falls);
- the strategy's all_gather, reduce, broadcast and barrier give the right
  values (mp's control plane), and the data plane is Gloo (no MPI).

    check_lightning.py
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
failed = []


def check(ok, what):
    print(("ok  : " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failed.append(what)


def run(out, *args):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, os.path.join(HERE, "lightning_case.py"), *args, "--out", out],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        sys.exit(f"lightning_case.py {' '.join(args)}: exit {p.returncode}")
    with open(out) as f:
        return json.load(f), time.monotonic() - t0


def main():
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "ckpt")
        fit, seconds = run(os.path.join(tmp, "fit.json"), "fit", "--ckpt-dir", ckpt)
        plain, _ = run(os.path.join(tmp, "plain.json"), "plain")
        check(fit["world_size"] == 2 and fit["data_plane"] == "Gloo" and len(fit["losses"]) == 8,
              f"Trainer(strategy=MPStrategy(...), accelerator='cpu', devices=2): 2 ranks over Gloo, 8 steps "
              f"in {seconds:.1f} s")
        check(fit["losses"] == plain["losses"] and fit["norms"] == plain["norms"],
              "fp32 deterministic: Lightning's losses and norms equal the plain shard loop's bit for bit")
        check(fit["lrs"] == plain["lrs"] and fit["lrs"][1] < fit["lrs"][0],
              f"the LambdaLR of configure_optimizers drives mp's lr ({fit['lrs'][0]:g} -> {fit['lrs'][-1]:g})")
        c = fit["collectives"]
        check(c == {"all_gather": [[0, 0], [1, 10]], "reduce_sum": 3.0, "reduce_mean": 1.5,
                    "broadcast": {"from": 1}}, f"the strategy's all_gather, reduce, broadcast: {c}")
        resumed, _ = run(os.path.join(tmp, "resumed.json"), "fit", "--resume",
                         os.path.join(ckpt, "epoch=0-step=4.ckpt"))
        check(resumed["losses"] == fit["losses"][4:] and resumed["norms"] == fit["norms"][4:]
              and resumed["lrs"] == fit["lrs"][4:],
              "the checkpoint Lightning saved after epoch 1 resumes: steps 5-8 bit for bit")
        bf16, _ = run(os.path.join(tmp, "bf16.json"), "fit", "--recipe", "BF16_MASTER")
        first, last = float.fromhex(bf16["losses"][0]), float.fromhex(bf16["losses"][-1])
        check(last < 0.97 * first, f"bf16_master trains: loss {first:.4f} -> {last:.4f}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

"""mp.torch across ranks (CTest python_torch_ranks):

- mp.torch.shard in the user's own loop, 2 ranks FULL_SHARD, one backward
  each, equal 1 rank with 2 backwards bit for bit: every step's loss and
  gradient norm, and the final weights, for each of gpt2_case.py's models
  (GPT-2, Llama, Qwen2, ResNet), and GPT-2 under optimizer kind MUON;
- a checkpoint the 2 ranks save mid-run, resumed on 1 rank, continues with
  the same bits;
- the engine's memory as measured equals its plan at 1, 2 and 4 ranks
  (GPT-2), and mp.torch.plan's, made on any rank count without an engine;
  full_state_dict(rank0_only=True) gives rank 0 the whole dict and rank 1
  none;
- rank 1 skipping its backward fails the step on both ranks, each with an
  mp error naming the other, within the collective timeout (no hang).

    check_ranks.py MPRUN [--steps N]
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(mprun, np, *args, timeout=600):
    cmd = [mprun, "-np", str(np), sys.executable, os.path.join(HERE, "torch_ranks.py"), *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


def check_memory(out):
    """Measured == plan on 1, 2 and 4 ranks, and == the plans of the same
    config made on other rank counts; True on a failure. (The engine's
    "other" bytes, a few kB of tables, are outside the plan.)"""
    failed = False
    counted = ("master", "optimizer_state", "gradient", "gathered_params", "comm_scratch", "param_shards")
    for np, r in sorted(out.items()):
        for other, o in sorted(out.items()):
            if o["micro_batches"] != r["micro_batches"]:
                continue
            want = o["plans"][str(np)]
            got = {c: r["memory"][c] for c in counted}
            if got != {c: want[c] for c in counted} or r["plan"] != want:
                print(f"FAIL: gpt2 on {np} rank(s): measured {got}, its plan {r['plan']}, "
                      f"planned on {other} rank(s) {want}")
                failed = True
        if not r["rank0_only"]:
            print(f"FAIL: full_state_dict(rank0_only=True) on {np} rank(s): not the whole dict on rank 0 alone")
            failed = True
    if not failed:
        print("gpt2: measured memory equals the plan on 1, 2 and 4 ranks, planned on each; "
              "full_state_dict(rank0_only=True) on rank 0 alone")
    return failed


def main():
    mprun = sys.argv[1]
    steps = sys.argv[sys.argv.index("--steps") + 1] if "--steps" in sys.argv else "10"
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for model, muon in (("gpt2", False), ("llama", False), ("qwen2", False), ("resnet", False),
                            ("gpt2", True)):
            out = {}
            label = model + (" MUON" if muon else "")
            for np, k in ((1, 2), (2, 1)):
                path = os.path.join(tmp, f"{model}{'_muon' if muon else ''}_np{np}.json")
                extra = ["--save-at", "5", "--checkpoint", os.path.join(tmp, "ckpt")] \
                    if model == "gpt2" and not muon and np == 2 else []
                if muon:
                    extra.append("--muon")
                p, seconds = run(mprun, np, "train", "--model", model, "--micro-batches", str(k), "--steps", steps,
                                 "--out", path, *extra)
                if p.returncode != 0:
                    print(p.stdout, p.stderr)
                    sys.exit(f"{label}: {np} rank(s) x {k} micro-batches: exit {p.returncode}")
                with open(path) as f:
                    out[np] = json.load(f)
                print(f"{label}: {np} rank(s) x {k} backward(s) a step: {steps} steps in {seconds:.1f} s, "
                      f"final loss {float.fromhex(out[np]['losses'][-1]):.6f}")
            bad = [key for key in ("losses", "norms", "weights_sha256") if out[1][key] != out[2][key]]
            for key in bad:
                print(f"FAIL ({label}): {key} differ between 1 rank x 2 backwards and 2 ranks x 1:\n"
                      f"  {out[1][key]}\n  {out[2][key]}")
            failed = failed or bool(bad)
            if not bad:
                print(f"{label}: 2 ranks FULL_SHARD equal 1 rank with 2 backwards bit for bit "
                      "(losses, norms, weights)")
            if model == "gpt2" and not muon:
                path = os.path.join(tmp, "np4.json")
                p, _ = run(mprun, 4, "train", "--steps", "1", "--out", path)
                if p.returncode != 0:
                    print(p.stdout, p.stderr)
                    sys.exit(f"gpt2 on 4 ranks: exit {p.returncode}")
                with open(path) as f:
                    out[4] = json.load(f)
                path = os.path.join(tmp, "np2_bf16.json")  # gradients handed over in bf16
                p, _ = run(mprun, 2, "train", "--steps", "1", "--recipe", "BF16_MASTER", "--out", path)
                if p.returncode != 0:
                    print(p.stdout, p.stderr)
                    sys.exit(f"gpt2 bf16_master on 2 ranks: exit {p.returncode}")
                with open(path) as f:
                    bf16 = json.load(f)
                failed = check_memory(out) or check_memory({2: bf16}) or failed
                path = os.path.join(tmp, "resumed.json")
                p, _ = run(mprun, 1, "train", "--micro-batches", "2", "--steps", steps, "--out", path, "--resume",
                           os.path.join(tmp, "ckpt"))
                resumed = json.load(open(path)) if p.returncode == 0 else None
                if resumed is None or resumed["first"] != 5 or resumed["losses"] != out[1]["losses"][5:] \
                        or resumed["weights_sha256"] != out[1]["weights_sha256"]:
                    print(p.stdout, p.stderr)
                    print("FAIL: the 2 ranks' checkpoint of step 5, resumed on 1 rank, did not continue bit for bit")
                    failed = True
                else:
                    print("gpt2: the 2 ranks' checkpoint of step 5 resumed on 1 rank continues bit for bit")

        p, seconds = run(mprun, 2, "skip", "--rank", "1", "--step", "2", timeout=120)
        # The ranks' lines may share a line of mpirun's output: find each.
        lines = re.findall(r"rank \d+: \w+Error as expected after [0-9.]+ s", p.stdout)
        if sorted(l.split(":")[0] for l in lines) != ["rank 0", "rank 1"]:
            print(p.stdout, p.stderr)
            print(f"FAIL: rank 1 skipping its backward did not fail the step on both ranks "
                  f"(exit {p.returncode})")
            failed = True
        else:
            print("\n".join(lines) + f"\n(the whole 2-rank run: {seconds:.1f} s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

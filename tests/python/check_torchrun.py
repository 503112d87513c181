"""mp.torch under torchrun, without mpirun (CTest python_torchrun):

- GPT-2, Llama and Qwen2 through mp.torch.shard on 2 ranks started by
  torchrun equal plain PyTorch + torch.optim.AdamW (each step the mean of
  the 2 ranks' micro-batches) within 1e-6 relative at every one of 20 steps
  (fp32, deterministic); the ranks said torchrun, the data plane was Gloo,
  and MPI was never initialised in the process;
- the same Llama run under launch/mprun gives the same losses, norms and
  final weights bit for bit;
- examples/torch_llama.py trains under torchrun (fp32, deterministic) and
  prints the lines it prints under mpirun;
- examples/hf_trainer.py (transformers' Trainer, unpatched, stepping
  mp.torch.ShardedOptimizer) trains under torchrun and its losses equal
  the plain shard loop's (1 rank, 2 backwards a step, the Trainer's lrs)
  within 1e-6 (fp32, deterministic);
- a rank killed (SIGKILL) in its backward makes the other fail with an mp
  error naming it, within the collective timeout (5 s);
- a contradictory launch environment, and a data plane (MPI here) whose
  world size is not the launcher's, are mp.ConfigErrors naming the
  variables.

    check_torchrun.py MPRUN [--steps N]
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import gpt2_case as case

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
EXAMPLE = os.path.join(EXAMPLES, "torch_llama.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
failed = []


def check(ok, what):
    print(("ok  : " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failed.append(what)
    return ok


def run(cmd, env=None, timeout=600):
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return p, time.monotonic() - t0


def train(launcher, model, steps, out):
    p, seconds = run([*launcher, os.path.join(HERE, "torch_ranks.py"), "train", "--model", model, "--steps",
                      str(steps), "--out", out])
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        sys.exit(f"{model}: {launcher[0]}: exit {p.returncode}")
    with open(out) as f:
        return json.load(f), seconds


def hf_trainer_against_the_plain_loop(steps=10, batch=4):
    p, seconds = run([*TORCHRUN, os.path.join(EXAMPLES, "hf_trainer.py"), "--steps", str(steps), "--batch",
                      str(batch), "--recipe", "RECIPE_FP32", "--deterministic"])
    got = [tuple(float(x) for x in m) for m in re.findall(r"^step +\d+  loss (\S+)  norm (\S+)  lr (\S+)$", p.stdout, re.M)]
    if not check(p.returncode == 0 and len(got) == steps,
                 f"examples/hf_trainer.py under torchrun: {len(got)} steps in {seconds:.1f} s (exit {p.returncode})"):
        print(p.stdout, p.stderr)
        return
    sys.path.insert(0, EXAMPLES)
    import hf_trainer
    import mp
    import mp.torch
    import torch
    mp.init()  # the reference: 1 rank, the 2 ranks' batches as 2 backwards
    model = hf_trainer.make_model()
    sharded = mp.torch.shard(model, config=hf_trainer.config_text("RECIPE_FP32", True, 1e-3) + " micro_batches: 2")
    worst = 0.0
    for s, (loss, _, lr) in enumerate(got):
        sharded.lr = lr
        for r in range(2):
            tokens = torch.stack([hf_trainer.sequence(r + 2 * j) for j in range(s * batch, (s + 1) * batch)])
            model(input_ids=tokens, labels=tokens).loss.backward()
        worst = max(worst, abs(sharded.step().loss - loss) / abs(loss))
    sharded.close()
    check(worst <= 1e-6, f"examples/hf_trainer.py: {steps} steps equal the plain shard loop's, worst relative loss "
                         f"difference {worst:.3g} (at most 1e-6)")


def main():
    import torch
    torch.set_num_threads(1)
    mprun = sys.argv[1]
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 20
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for model in ("gpt2", "llama", "qwen2"):
            got, seconds = train(TORCHRUN, model, steps, os.path.join(tmp, f"{model}.json"))
            runs[model] = got
            check(got["launcher"] == "torchrun" and got["data_plane"] == "Gloo" and not got["mpi_initialized"]
                  and got["world_size"] == 2,
                  f"{model}: torchrun's 2 ranks, Gloo, MPI not initialised ({got['launcher']}, {got['data_plane']}, "
                  f"MPI_Initialized {got['mpi_initialized']}; {seconds:.1f} s)")
            ours = [float.fromhex(x) for x in got["losses"]]
            theirs = case.torch_adamw_losses(case.make(model), steps, ranks=2)
            worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
            check(len(ours) == steps and worst <= 1e-6,
                  f"{model}: {steps} steps under torchrun equal PyTorch + AdamW, worst relative loss difference "
                  f"{worst:.3g} (at most 1e-6)")

        mpi, _ = train([mprun, "-np", "2", sys.executable], "llama", steps, os.path.join(tmp, "llama_mpi.json"))
        check(mpi["launcher"] == "MPI" and mpi["data_plane"] == "MPI", "llama under mpirun: MPI's ranks and data plane")
        same = [k for k in ("losses", "norms", "weights_sha256") if mpi[k] == runs["llama"][k]]
        check(len(same) == 3, f"llama: torchrun (Gloo) and mpirun (MPI) give the same {', '.join(same) or 'nothing'} "
                              "bit for bit")

        example = [EXAMPLE, "--steps", "4", "--layers", "2", "--threads", "1", "--recipe", "RECIPE_FP32",
                   "--deterministic"]
        lines, logs = {}, {}
        for name, launcher in (("torchrun", TORCHRUN), ("mpirun", [mprun, "-np", "2", "--bind-to", "none",
                                                                     sys.executable])):
            p, seconds = run([*launcher, *example])
            lines[name] = re.findall(r"step +\d+  loss \S+  norm \S+  lr \S+", p.stdout)
            logs[name] = p.stderr
            check(p.returncode == 0 and len(lines[name]) == 4,
                  f"examples/torch_llama.py under {name}: 4 steps in {seconds:.1f} s (exit {p.returncode})")
            if p.returncode != 0:
                print(p.stdout, p.stderr)
        check(lines["torchrun"] == lines["mpirun"], "examples/torch_llama.py prints the same losses under both")
        check("data plane: Gloo over TCP, MPI not started" in logs["torchrun"]
              and "ranks: torchrun (RANK=0" in logs["torchrun"],
              "rank 0 logs the source of its ranks (torchrun) and the data plane")

        # A rank killed mid-step. torchrun's agent ends the job once it sees a
        # worker die (every --monitor-interval): 3 s here, so that the
        # survivor's own report is not cut short.
        p, seconds = run([*TORCHRUN[:-2], "--nproc-per-node", "2", "--monitor-interval", "3",
                          os.path.join(HERE, "torch_ranks.py"), "kill", "--rank", "1", "--step", "2"], timeout=120)
        said = re.search(r"rank 0: (\w+) as expected after ([0-9.]+) s: (.*)", p.stdout)
        check(p.returncode != 0 and said is not None and float(said.group(2)) < 5,
              f"rank 1 killed in its backward: rank 0 fails naming it "
              f"({said.group(1) + ' after ' + said.group(2) + ' s: ' + said.group(3)[:300] if said else 'no report'})")
        if said is None:
            print(p.stdout, p.stderr)

        # The environment, no launcher needed.
        probe = [sys.executable, "-c", "import mp, sys; mp.init(data_plane=sys.argv[1])"]
        base = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "SLURM_"))}
        bad = {**base, "RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "OMPI_COMM_WORLD_RANK": "0",
               "OMPI_COMM_WORLD_SIZE": "2"}
        p, _ = run([*probe, "auto"], env=bad)
        check(p.returncode != 0 and "ConfigError" in p.stderr and "contradictory launch environment" in p.stderr
              and "WORLD_SIZE=4" in p.stderr and "OMPI_COMM_WORLD_SIZE=2" in p.stderr,
              "WORLD_SIZE=4 with OMPI_COMM_WORLD_SIZE=2 is a ConfigError naming both: "
              + (p.stderr.strip().splitlines() or ["(nothing)"])[-1][:300])
        two = {**base, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
        p, _ = run([*probe, "mpi"], env=two)
        check(p.returncode != 0 and "the launcher started 2 ranks" in p.stderr and "MPI's world has 1 rank" in p.stderr,
              "a launcher's 2 ranks on an MPI world of 1 is a ConfigError: "
              + (p.stderr.strip().splitlines() or ["(nothing)"])[-1][:300])
        hf_trainer_against_the_plain_loop()  # last: its reference starts MPI in this process
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

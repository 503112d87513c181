"""The stages that run the worker and the benchmarks: smoke, agree, gemm,
update, faults, gpt2, report."""
import os
import shutil
import sys

from . import env as envmod
from . import judge, report

SMOKE_STEPS = 10
PROFILE_STEPS = 8


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    return path


def smoke(ctx, st):
    s = ctx.s
    run_dir = fresh(ctx.path("smoke"))
    r = ctx.runner.run("smoke", ctx.worker(["--steps", str(SMOKE_STEPS), "--set", f"compute.device={s.device}",
                                            "--set", "log_interval=1", "--set", "sample_interval=0",
                                            "--out", run_dir]), env={"MP_CUDA_SYNC": "1"})
    row = judge.smoke(run_dir, ctx.log_text("smoke"), SMOKE_STEPS)
    if not r.ok:
        row.update({"pass": False, "exit": r.rc})
    st.row(row)
    return row["pass"]


def agree(ctx, st):
    s, run = ctx.s, ctx.runner
    steps = s.agree_steps
    half = steps // 2
    ok = True
    for recipe in ("RECIPE_FP32", "BF16_MASTER"):
        base = fresh(ctx.path(f"agree_{recipe}"))
        common = ["--steps", str(steps), "--set", f"engine.precision.recipe={recipe}"]
        ok &= run.run(f"agree_cpu_{recipe}", ctx.worker(common + ["--set", "compute.device=CPU",
                                                                  "--out", f"{base}/cpu"])).ok
        ok &= run.run(f"agree_gpu_{recipe}", ctx.worker(common + [
            "--set", f"compute.device={s.device}", "--set", f"sample_interval={half}",
            "--set", f"checkpoint.interval_steps={half}", "--out", f"{base}/gpu"])).ok
        try:
            row = judge.agree(f"{base}/gpu", f"{base}/cpu", recipe)
        except (OSError, ValueError) as e:
            row = {"case": f"agree_{recipe}", "pass": False, "why": f"no metrics: {e}"}
        st.row(row)
        ok &= row["pass"]
    # Checkpoints of the device run: verify, export, resume from the middle.
    gpu = ctx.path("agree_BF16_MASTER", "gpu")
    ckpt = os.path.join(gpu, "checkpoints", f"step_{half:08d}")
    export, resumed = fresh(ctx.path("export")), fresh(ctx.path("resumed"))
    good = run.run("verify", [os.path.join(s.build, "mp_worker"), "--verify-checkpoint",
                              os.path.join(gpu, "checkpoints")]).ok
    good &= run.run("export", ctx.worker(["--steps", str(half), "--set", f"compute.device={s.device}",
                                          "--resume", ckpt, "--export-safetensors", export])).ok
    safetensors = os.path.join(export, "model.safetensors")
    good &= os.path.isfile(safetensors) and os.path.getsize(safetensors) > 0
    good &= run.run("resume", ctx.worker(["--steps", str(steps), "--set", "engine.precision.recipe=BF16_MASTER",
                                          "--set", f"compute.device={s.device}", "--set", f"sample_interval={half}",
                                          "--resume", ckpt, "--out", resumed])).ok
    same = judge.resumed_equal(gpu, resumed, half)
    st.row({"case": "gpu_checkpoint_verify_export_resume", "pass": bool(good and same), "resumed_losses_equal": same})
    return bool(ok and good and same)


def bench_suite(ctx, st, stage, suite, argv, to_row):
    """An mp_bench suite on one rank, a row per JSON line as it is printed;
    a failed row when it printed none or exited non-zero without one."""
    rows = []

    def on_line(line):
        row = to_row(line)
        if row is not None:
            rows.append(row)
            st.row(row)

    r = ctx.runner.run(stage, ctx.bench([suite, "--json-only"] + argv), on_line=on_line)
    failed = judge.bench_failure(suite, ctx.log_text(stage), r.rc, rows)
    if failed:
        st.row(failed)
    return r.ok and not failed and not any(row.get("pass") is False for row in rows)


def gemm(ctx, st):
    """The GEMM table of GPT-2 124M (mp_bench gemm_cuda)."""
    return bench_suite(ctx, st, "gemm", "gemm_cuda", [], judge.gemm_row)


def update(ctx, st):
    """The fused AdamW step against a copy (mp_bench update_cuda); on a
    rehearsal the CPU's suite at a small size."""
    if ctx.s.device == "CUDA":
        return bench_suite(ctx, st, "update", "update_cuda", [], judge.bench_row)
    return bench_suite(ctx, st, "update", "update", ["--sizes", "64K", "--iters", "1", "--warmup", "0"],
                       judge.bench_row)


# The fault cases the faults stage runs: classes of tests/worker/test_faults.py (pytest).
FAULT_CASES = {"kill": "TestKilledRank", "hang": "TestHungRank", "nan": "TestNanGradients",
               "device_fault": "TestDeviceFault"}


def faults(ctx, st):
    s = ctx.s
    args = f"--set compute.device={s.device}"
    if s.device != "CUDA" or envmod.gpu_count() < 2:
        args += " --set compute.share_gpus=true"
    ok = True
    for case, cls in FAULT_CASES.items():
        test = os.path.join(s.root, "tests", "worker", "test_faults.py") + "::" + cls
        r = ctx.runner.run(f"fault_{case}", [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                                             test, "--worker", os.path.join(s.build, "mp_worker"),
                                             "--mprun", ctx.runner.mprun, f"--worker-args={args}",
                                             "--basetemp", ctx.path(f"fault_{case}")],
                           env={"PYTHONDONTWRITEBYTECODE": "1"})
        what = [line for line in ctx.log_text(f"fault_{case}").splitlines() if line.startswith(f"{case}: ")]
        st.row({"case": f"fault_{case}", "pass": r.ok, "what": what[0] if what else ""})
        ok &= r.ok
    return ok


def gpt2_argv(ctx, batch, run_dir, extra):
    """GPT-2 124M at batch B (T = 1024, bf16_master, synthetic data, one
    micro-batch a step) into run_dir."""
    return ["configs/gpt2_124m.textproto", "--set", "data.train_path=", "--set", "data.val_path=",
            "--set", f"data.micro_batch_size={batch}", "--set", "engine.precision.recipe=BF16_MASTER",
            "--set", "engine.micro_batches=1", "--set", "val_interval=0", "--set", "sample_interval=0",
            "--set", f"compute.device={ctx.s.device}"] + extra + ctx.s.gpt2_args + ["--out", run_dir]


def gpt2(ctx, st):
    """The worker at each batch (its row written as soon as it ran, judged
    against the PyTorch rows there are so far), PyTorch eager at every batch
    in one process (each batch's row judged again), the op profile, then
    torch.compile where the time it needs is left."""
    s, run = ctx.s, ctx.runner
    eager = [m for m in s.torch_modes if m and not m.endswith("_compile")]
    compiled = [m for m in s.torch_modes if m.endswith("_compile")]
    for name in os.listdir(s.state):  # the run directories of an earlier call
        if name.startswith(("gpt2_b", "gpt2.")) and os.path.isdir(ctx.path(name)):
            shutil.rmtree(ctx.path(name), ignore_errors=True)
    torch_file = ctx.path("torch_gpt2.jsonl")
    open(torch_file, "w").close()
    ok = True

    def judge_batch(b):
        row = judge.speed(ctx.path(f"gpt2_b{b}"), s.peak_tflops, report.read_rows(torch_file), 5, batch=b,
                          log_text=ctx.log_text(f"gpt2_b{b}"))
        st.put(row)
        return "why" not in row

    for b in s.gpt2_batches:
        r = run.run(f"gpt2_b{b}", ctx.worker(gpt2_argv(ctx, b, ctx.path(f"gpt2_b{b}"),
                                                       ["--steps", str(s.gpt2_steps), "--set", "log_interval=1"])))
        ok &= judge_batch(b) and r.ok

    def torch_line(line):
        row = judge.bench_row(line)
        if row is not None:
            report.append_row(torch_file, row)

    def torch_run(name, batches, modes, timeout=None):
        argv = [sys.executable, os.path.join(s.root, "bench", "torch_gpt.py")] + s.torch_args + [
            "--batch", ",".join(map(str, batches)), "--modes", ",".join(modes)]
        return run.run(name, argv, timeout=timeout, on_line=torch_line)

    if eager:  # one process for every batch (its start once)
        torch_run("torch_gpt2", s.gpt2_batches, eager)
        for b in s.gpt2_batches:
            judge_batch(b)
    # Where the step's time goes, by op family (MP_OP_PROFILE: events around
    # every op, one wait per micro-batch, so a run of its own), at the last batch.
    b = s.gpt2_batches[-1]
    ok &= run.run("gpt2_profile", ctx.worker(gpt2_argv(ctx, b, ctx.path("gpt2.profile"),
                                                       ["--steps", str(PROFILE_STEPS)])),
                  env={"MP_OP_PROFILE": "1"}).ok
    profile = [line for line in ctx.log_text("gpt2_profile").splitlines() if line.startswith("compute by op family")]
    st.row({"case": f"gpt2_124m_op_profile_b{b}", "profile": profile[0] if profile else ""})
    # torch.compile, the largest batch first, where the time it needs is left.
    for b in sorted(s.gpt2_batches, reverse=True):
        for mode in compiled:
            left = int(st.left())
            if left < s.compile_s + 15:
                st.note(f"torch {mode} at B={b} skipped: it needs about {s.compile_s} s (MP_GPU_CHECK_COMPILE_S), "
                        f"{left} s were left")
                continue
            r = torch_run(f"torch_gpt2_{mode}_b{b}", [b], [mode], timeout=left - 15)
            if r.timed_out:
                st.note(f"torch {mode} at B={b} stopped after {left - 15} s: not measured")
            judge_batch(b)
    n = envmod.gpu_count() if s.device == "CUDA" else 0
    if n > 1:  # every GPU, NCCL, FULL_SHARD: tokens/s of the job, not judged
        b = s.gpt2_batches[0]
        argv = gpt2_argv(ctx, b, ctx.path("gpt2.all"), ["--steps", "20", "--set", "engine.sharding.strategy=FULL_SHARD",
                                                       "--set", "log_interval=1"])
        ok &= run.run("gpt2_all", ctx.worker(argv, np=n)).ok
        row = judge.speed(ctx.path("gpt2.all"), s.peak_tflops * n, [], 5, batch=b,
                          log_text=ctx.log_text("gpt2_all"), judge=False)
        row["case"] = f"gpt2_124m_b{b}_{n}_gpus"
        st.row(row)
    return ok


def report_stage(ctx, st):
    return report.report(ctx.s.state, ctx.path("gpu_check.json"), ctx.commit) == 0

"""The judgements of the stages, on their outputs: run directories'
metrics, the worker's log lines, the lines of ctest, mp_bench and
compute-sanitizer. Each returns result rows (dicts; "pass" where judged).

Tolerances (docs/benchmarks.md "GPU check"): the fp32 recipe agrees with the
CPU at every step within FP32_REL_TOL of the CPU's loss (the GEMMs and
reductions sum in other orders, and 100 steps of training amplify the
differences); bf16 recipes end within BF16_FINAL_BAND nats of the CPU's
final loss (bf16 rounding flips differ, the curves wander apart step by
step, the end point is what matters).
"""
import json
import math
import os
import re
import statistics

FP32_REL_TOL = 2e-3
BF16_FINAL_BAND = 0.05


def read_metrics(run_dir):
    """The steps of a run directory's metrics.jsonl; ValueError when none."""
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl has no steps")
    return rows


def agree(gpu_dir, cpu_dir, recipe):
    """The loss curves of a device run and a CPU run against the recipe's tolerance."""
    gpu, cpu = read_metrics(gpu_dir), read_metrics(cpu_dir)
    if [r["step"] for r in gpu] != [r["step"] for r in cpu]:
        return {"case": f"agree_{recipe}", "pass": False, "why": "the runs logged different steps"}
    worst_rel, worst_step = 0.0, 0
    for g, c in zip(gpu, cpu):
        rel = abs(g["loss"] - c["loss"]) / max(abs(c["loss"]), 1e-12)
        if math.isnan(worst_rel):
            break  # the first NaN stays the worst
        if math.isnan(rel) or rel > worst_rel:
            worst_rel, worst_step = rel, g["step"]
    final_diff = abs(gpu[-1]["loss"] - cpu[-1]["loss"])
    row = {"case": f"agree_{recipe}", "steps": len(gpu), "gpu_final_loss": gpu[-1]["loss"],
           "cpu_final_loss": cpu[-1]["loss"], "final_diff_nats": final_diff,
           "worst_rel_diff": worst_rel, "worst_step": worst_step}
    if recipe in ("fp32", "RECIPE_FP32"):
        row["tolerance"] = f"|gpu - cpu| <= {FP32_REL_TOL} x cpu at every step"
        row["pass"] = worst_rel <= FP32_REL_TOL
    else:
        row["tolerance"] = f"|final gpu - final cpu| <= {BF16_FINAL_BAND} nats"
        row["pass"] = final_diff <= BF16_FINAL_BAND
    return row


def resumed_equal(first_dir, resumed_dir, after_step):
    """Whether a run resumed from a checkpoint at `after_step` logged the
    same losses as the first run at every later step (and logged some)."""
    try:
        first = {r["step"]: r["loss"] for r in read_metrics(first_dir)}
        again = {r["step"]: r["loss"] for r in read_metrics(resumed_dir)}
    except (OSError, ValueError):
        return False
    steps = [s for s in again if s > after_step]
    return bool(steps) and all(first.get(s) == again[s] for s in steps)


# ---- what the worker logs ---------------------------------------------------------

OPS_LINE = re.compile(r"^ops per step \(rank 0\): (\d+) \(model (\d+), engine (\d+)\)")
PLAN_LINE = re.compile(r"^  gemm plan: (.*?): (.+?), algorithm (-?\d+) of (\d+)")
ENGINE_LINE = re.compile(r"^engine: .*; (\d+) rank\(s\) x (\d+) thread\(s\)")
ATTENTION = re.compile(r"^model: .*; CUDA kernels, (.*?); loss in chunks of")
# Where the worker says which cuDNN it loaded: the line it prints when it
# prints one ("cudnn (rank 0): cuDNN 91900 at /path/libcudnn.so.9, ...").
CUDNN_LINE = re.compile(r"^cudnn \(rank 0\): (.+)$")
DEVICE_LINE = "device (rank 0): "


def step_ops(log_text):
    """The worker's "ops per step" line (launch/run_log.cc, printed after the
    second step) and the "  gemm plan: PROBLEM: FORM, algorithm A of N, ..."
    lines under it: {"ops_per_step", "ops_model", "ops_engine", "gemm_plans",
    "gemm_plan_forms": {form: count}}; {} when there is no ops line."""
    out, forms = {}, {}
    for line in log_text.splitlines():
        m = OPS_LINE.match(line)
        if m and not out:
            out = {"ops_per_step": int(m.group(1)), "ops_model": int(m.group(2)), "ops_engine": int(m.group(3))}
            continue
        p = PLAN_LINE.match(line)
        if p and out:
            forms[p.group(2)] = forms.get(p.group(2), 0) + 1
    if out:
        out["gemm_plans"] = sum(forms.values())
        out["gemm_plan_forms"] = forms
    return out


def worker_facts(log_text):
    """What a worker's log says of how it ran: its device, its threads per
    rank (1 when the launcher bound it to a core), the attention path of a
    GPT on a GPU (cuDNN's fused attention or the flash kernels, and why),
    and which cuDNN it loaded where it says so."""
    facts = {}
    for line in log_text.splitlines():
        if line.startswith(DEVICE_LINE) and "device" not in facts:
            facts["device"] = line[len(DEVICE_LINE):].strip()
        m = ENGINE_LINE.match(line)
        if m and "threads" not in facts:
            facts["threads"] = int(m.group(2))
        m = ATTENTION.match(line)
        if m and "attention" not in facts:
            attention = m.group(1)
            one = attention.startswith("attention: ") and "; attention from block" not in attention
            facts["attention"] = attention[len("attention: "):] if one else attention
        m = CUDNN_LINE.match(line)
        if m and "cudnn" not in facts:
            facts["cudnn"] = m.group(1)
    return facts


def smoke(run_dir, log_text, steps):
    """The smoke run (MP_CUDA_SYNC=1): all its steps logged, every loss finite."""
    row = {"case": "smoke_cuda_sync", "steps_expected": steps}
    try:
        losses = [r["loss"] for r in read_metrics(run_dir)]
        row.update({"steps": len(losses), "final_loss": losses[-1],
                    "pass": len(losses) == steps and all(math.isfinite(x) for x in losses)})
    except (OSError, ValueError) as e:
        row.update({"pass": False, "why": f"no metrics: {e}"})
    row.update(worker_facts(log_text))
    return row


# ---- GPT-2's speed --------------------------------------------------------------

# The GPU targets of GPT-2 124M (docs/benchmarks.md "GPU check"), by batch:
# (the row's key, the least it may be, required), judged where the key is
# there (a PyTorch mode that did not run is not judged, but for the eager
# ratio at B = 4, which is the target itself).
MAX_OPS_PER_STEP = 300
SPEED_TARGETS = {
    4: [("ratio_to_torch_amp_bf16", 1.3, True)],
    16: [("mfu", 0.40, True), ("ratio_to_torch_amp_bf16_compile", 1.0, False)],
}


def torch_rows(rows, batch):
    """PyTorch's rows (bench/torch_gpt.py) at this batch: {mode: row}."""
    found = {}
    for t in rows:
        if batch is None or t.get("batch", batch) == batch:
            found[t.get("case", "").replace("gpt2_124m_", "")] = t
    return found


def speed(run_dir, peak_tflops, torch, skip, batch=None, log_text="", judge=True):
    """GPT-2's row at one batch: tokens/s (median after the first `skip`
    steps), MFU = tokens/s x F / peak (F: the model's FLOPs per token as the
    worker logs them, 6 N + 12 L C T), the ops per step and how the worker
    ran (worker_facts) from its log, the ratio to each of PyTorch's rows
    (`torch`) at the same batch, and the verdict on the batch's targets
    (pass; missed: the targets missed). A run without metrics is a failed
    row (why)."""
    out = {"case": f"gpt2_124m_b{batch}" if batch is not None else "gpt2_124m_speed"}
    if batch is not None:
        out["batch"] = batch
    try:
        rows = read_metrics(run_dir)
    except (OSError, ValueError) as e:
        rows = []
        out.update({"pass": False, "why": f"no metrics: the run failed ({e})"})
    ops = step_ops(log_text)
    ratios, torch_out, rest = {}, {}, {}
    if rows:
        timed = [r for r in rows if r["step"] > skip] or rows
        tps = statistics.median(r["tokens_per_s"] for r in timed)
        flops_per_token = round(timed[0]["model_flops_per_s"] / timed[0]["tokens_per_s"])
        out.update({"tokens_per_s": round(tps, 1), "mfu": round(tps * flops_per_token / (peak_tflops * 1e12), 4)})
        for mode, t in torch_rows(torch, batch).items():
            if "value" in t:
                ratios[f"ratio_to_torch_{mode}"] = round(tps / t["value"], 3)
                torch_out[f"torch_{mode}_tokens_per_s"] = t["value"]
            elif "error" in t:
                torch_out[f"torch_{mode}_error"] = t["error"]
        rest = {"steps_timed": len(timed), "flops_per_token": flops_per_token, "peak_tflops": peak_tflops,
                "final_loss": rows[-1]["loss"]}
    # In this order: the table prints a row's first keys.
    out.update({k: ops[k] for k in ("ops_per_step",) if k in ops})
    out.update(ratios)
    out.update(ops)
    out.update(torch_out)
    out.update(rest)
    out.update(worker_facts(log_text))
    if not judge or not rows:
        return out
    targets = [("ops_per_step", MAX_OPS_PER_STEP, True, "<=")] + [
        (key, least, required, ">=") for key, least, required in SPEED_TARGETS.get(batch, [])]
    out["target"] = " and ".join(f"{k} {op} {v}" + ("" if req else f" (where {k} was measured)")
                                 for k, v, req, op in targets)
    missed = []
    for key, bound, required, op in targets:
        if key not in out:
            if required:
                missed.append(f"{key} not measured")
            continue
        if (out[key] > bound) if op == "<=" else (out[key] < bound):
            missed.append(f"{key} {out[key]} (target {op} {bound})")
    out["pass"] = not missed
    if missed:
        out["missed"] = missed
    return out


# ---- mp_bench's rows --------------------------------------------------------------

def bench_row(line):
    """One JSON line of mp_bench as a row (None for other lines)."""
    if not line.startswith("{"):
        return None
    try:
        return json.loads(line)
    except ValueError:
        return None


def gemm_row(line):
    """A line of `mp_bench gemm_cuda` as a row, the table's keys first
    (TFLOP/s, ratio to the peak, speed-up over the plain fp32 product, ms,
    the plan's form); a case with an error fails. None for other lines."""
    r = bench_row(line)
    if r is None:
        return None
    r.pop("suite", None)
    head = {"case": r.pop("case", "?")}
    if "error" in r:
        head["pass"] = False
    for key in ("value", "ratio", "speedup_over_plain", "ms"):
        if key in r:
            head[key] = r.pop(key)
    if isinstance(r.get("plan"), dict) and "form" in r["plan"]:
        head["form"] = r["plan"]["form"]
    head.update(r)
    return head


def bench_failure(suite, log_text, exit_code, rows):
    """The failed row of an mp_bench suite that printed no rows, or exited
    non-zero with no failed row (its last error line says why); else None."""
    if rows and (exit_code == 0 or any(r.get("pass") is False for r in rows)):
        return None
    said = [line.strip() for line in log_text.splitlines() if line.strip()]
    errors = [line for line in said if "rank" in line and ("rror" in line or "needs" in line)]
    return {"case": suite, "pass": False, "exit": exit_code, "why": (errors or said or ["no output"])[-1][:500]}


# ---- ctest and compute-sanitizer --------------------------------------------------

CTEST_LINE = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) \.*\s*(?:\*\*\*)?(.+?)\s+([\d.]+) sec\s*$")


def ctest_row(line):
    """The row of one of ctest's result lines (name, result, seconds), else None."""
    m = CTEST_LINE.match(line)
    if not m:
        return None
    name, result, secs = m.groups()
    return {"case": f"ctest_{name}", "pass": result == "Passed", "result": result, "seconds": float(secs)}


def sanitized_command(command, build_dir, sanitizer_args):
    """The command with the sanitizer in front of the test binary: the first
    argument that is an executable file inside the build folder (the test
    binary itself, or the one launch/mprun starts on every rank). None when
    there is none."""
    build = os.path.realpath(build_dir)
    for i, arg in enumerate(command):
        path = os.path.realpath(arg)
        if path.startswith(build + os.sep) and os.path.isfile(path) and os.access(path, os.X_OK):
            return command[:i] + list(sanitizer_args) + command[i:]
    return None


SANITIZER_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")
# What compute-sanitizer says where it cannot run at all (seen on machines
# that run the GPU under gVisor).
SANITIZER_REFUSED = re.compile(r"Device not supported")


def sanitizer_verdict(log_text, exit_code, skip_patterns):
    """(pass, errors, why) of one test under compute-sanitizer: it ran (not
    skipped), every process printed a summary, no errors, exit 0."""
    counts = [int(n) for n in SANITIZER_SUMMARY.findall(log_text)]
    errors = sum(counts)
    if SANITIZER_REFUSED.search(log_text):
        return False, errors, ("compute-sanitizer refused this device or runtime (\"Device not supported\"): "
                               "not a verdict on mp")
    if any(re.search(p, log_text) for p in skip_patterns if p):
        return False, errors, "skipped: the device was not usable"
    if errors:
        return False, errors, f"{errors} memcheck error(s)"
    if not counts:
        return False, 0, "no ERROR SUMMARY: the sanitizer did not finish"
    if exit_code != 0:
        return False, 0, f"exit {exit_code}"
    return True, 0, ""

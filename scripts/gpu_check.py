#!/usr/bin/env python3
"""scripts/gpu_check.py: the judgements, the summaries and the report of
scripts/gpu_check (plain Python 3, no packages), so that they can be tested
without a GPU (tests/check_gpu_check.py).

  agree GPU_RUN CPU_RUN --recipe R   the loss curves of two mp_worker run
                                     directories (metrics.jsonl) against the
                                     stated tolerance of recipe R; one JSON line
  speed RUN --peak-tflops P [--torch FILE] [--skip N] [--batch B] [--log LOG] [--put FILE] [--no-judge]
                                     GPT-2 at batch B: tokens/s (median after
                                     the first N steps), MFU = tokens/s x F / P
                                     (F: the model's FLOPs per token as
                                     mp_worker logs them, 6 N + 12 L C T), the
                                     ops per step from the worker's LOG, the
                                     ratio to PyTorch's rows at B in FILE, and
                                     the targets of B (SPEED_TARGETS); one JSON
                                     line (also put into FILE by case)
  gemm LOG [--exit RC]               the rows of mp_bench gemm_cuda's output
  smoke RUN LOG --steps N            the smoke run: every step logged, the loss
                                     finite; one JSON line
  ctest-rows LOG                     one JSON line per test of a `ctest -V` log
  memcheck BUILD SANITIZER LOG_DIR [--test-timeout S] [--budget S] [--jobs J]
                                     every CTest of label "gpu" once, its test
                                     binary under compute-sanitizer memcheck,
                                     J at a time; one JSON line per test as it
                                     ends
  report STATE_DIR OUT_JSON          every STAGE.jsonl of STATE_DIR in one JSON
                                     object, and a table on stdout
  summary STATE_DIR CALL_TSV OUT_JSON [--print] ...
                                     one call of scripts/gpu_check: each
                                     stage's status, seconds and result rows,
                                     the commit and the GPU (the call's
                                     gpu_check_summary.json)
  commit                             the commit measured (git_commit)
  mtimes save|restore STAMP [ROOT]   the sources' content hashes and mtimes
                                     after a build; restored for the files
                                     whose bytes did not change, so that a
                                     tree copied afresh does not rebuild
  merge OUT_JSON SUMMARY...          the summaries of several calls in one
                                     report (bench/results/gpu_check.json; a
                                     stage run twice: its last run), and the
                                     table

Tolerances (docs/benchmarks.md "GPU check"): the fp32 recipe agrees with the
CPU at every step within FP32_REL_TOL of the CPU's loss (the GEMMs and
reductions sum in other orders, and 100 steps of training amplify the
differences); bf16 recipes end within BF16_FINAL_BAND nats of the CPU's
final loss (bf16 rounding flips differ, the curves wander apart step by
step, the end point is what matters).
"""
import argparse
import concurrent.futures
import hashlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FP32_REL_TOL = 2e-3
BF16_FINAL_BAND = 0.05


def read_metrics(run_dir):
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    if not rows:
        raise SystemExit(f"gpu_check: {run_dir}/metrics.jsonl has no steps")
    return rows


def agree(gpu_dir, cpu_dir, recipe):
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


OPS_LINE = re.compile(r"^ops per step \(rank 0\): (\d+) \(model (\d+), engine (\d+)\)")
PLAN_LINE = re.compile(r"^  gemm plan: (.*?): (.+?), algorithm (-?\d+) of (\d+)")


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


# The GPU targets of GPT-2 124M (docs/benchmarks.md "GPU check"), by batch:
# (what, the row's key, the least it may be), judged where the key is there
# (a PyTorch mode that did not run is not judged, but for the eager ratio at
# B = 4, which is the target itself).
MAX_OPS_PER_STEP = 300
SPEED_TARGETS = {
    4: [("ratio_to_torch_amp_bf16", 1.3, True)],
    16: [("mfu", 0.40, True), ("ratio_to_torch_amp_bf16_compile", 1.0, False)],
}


def torch_rows(torch_file, batch):
    """PyTorch's rows (bench/torch_gpt.py) at this batch: {mode: row}."""
    rows = {}
    if torch_file and os.path.exists(torch_file):
        with open(torch_file) as f:
            for line in f:
                if not line.startswith("{"):
                    continue
                t = json.loads(line)
                if batch is not None and t.get("batch", batch) != batch:
                    continue
                rows[t.get("case", "").replace("gpt2_124m_", "")] = t
    return rows


def speed(run_dir, peak_tflops, torch_file, skip, batch=None, log=None, judge=True):
    """GPT-2's row at one batch: tokens/s (median after the first `skip`
    steps), MFU, the ops per step from the worker's log, the ratio to each
    PyTorch mode at the same batch, and the verdict on the batch's targets
    (pass; missed: the targets missed). A run without metrics is a failed
    row (why)."""
    out = {"case": f"gpt2_124m_b{batch}" if batch is not None else "gpt2_124m_speed"}
    if batch is not None:
        out["batch"] = batch
    try:
        rows = read_metrics(run_dir)
    except (OSError, SystemExit) as e:
        rows = []
        out.update({"pass": False, "why": f"no metrics: the run failed ({e})"})
    ops = {}
    if log and os.path.exists(log):
        with open(log, errors="replace") as f:
            ops = step_ops(f.read())
    ratios, torch, rest = {}, {}, {}
    if rows:
        timed = [r for r in rows if r["step"] > skip] or rows
        tps = statistics.median(r["tokens_per_s"] for r in timed)
        flops_per_token = round(timed[0]["model_flops_per_s"] / timed[0]["tokens_per_s"])
        out.update({"tokens_per_s": round(tps, 1), "mfu": round(tps * flops_per_token / (peak_tflops * 1e12), 4)})
        for mode, t in torch_rows(torch_file, batch).items():
            if "value" in t:
                ratios[f"ratio_to_torch_{mode}"] = round(tps / t["value"], 3)
                torch[f"torch_{mode}_tokens_per_s"] = t["value"]
            elif "error" in t:
                torch[f"torch_{mode}_error"] = t["error"]
        rest = {"steps_timed": len(timed), "flops_per_token": flops_per_token, "peak_tflops": peak_tflops,
                "final_loss": rows[-1]["loss"]}
    # In this order: the table prints a row's first keys.
    out.update({k: ops[k] for k in ("ops_per_step",) if k in ops})
    out.update(ratios)
    out.update(ops)
    out.update(torch)
    out.update(rest)
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


def put_row(path, row):
    """`row` into the JSON lines of `path`, in place of a row of its case."""
    rows = [r for r in read_rows(path) if r.get("case") != row.get("case")]
    rows.append(row)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(tmp, path)


def gemm_rows(log_text, exit_code):
    """The rows of `mp_bench gemm_cuda` (its JSON lines), the table's keys
    first (TFLOP/s, ratio to the peak, speed-up over the plain fp32
    product, ms, the plan's form); a case with an error fails. When the
    suite printed none, one failed row saying why (its last error line)."""
    rows = []
    for line in log_text.splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
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
        rows.append(head)
    if not rows or (exit_code != 0 and not any(r.get("pass") is False for r in rows)):
        said = [line.strip() for line in log_text.splitlines() if line.strip()]
        errors = [line for line in said if "rank" in line and ("rror" in line or "needs" in line)]
        rows.append({"case": "gemm_cuda", "pass": False, "exit": exit_code,
                     "why": (errors or said or ["no output"])[-1][:500]})
    return rows


def smoke(run_dir, log, steps):
    """The smoke run (MP_CUDA_SYNC=1): all its steps logged, every loss finite."""
    row = {"case": "smoke_cuda_sync", "steps_expected": steps}
    try:
        rows = read_metrics(run_dir)
    except (OSError, SystemExit) as e:
        row.update({"pass": False, "why": f"no metrics: {e}"})
        rows = []
    if rows:
        losses = [r["loss"] for r in rows]
        row.update({"steps": len(rows), "final_loss": losses[-1],
                    "pass": len(rows) == steps and all(math.isfinite(x) for x in losses)})
    try:
        with open(log, errors="replace") as f:
            device = [line.strip() for line in f if line.startswith("device (rank 0):")]
        if device:
            row["device"] = device[0][len("device (rank 0): "):]
    except OSError:
        pass
    return row


CTEST_LINE = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) \.*\s*(?:\*\*\*)?(.+?)\s+([\d.]+) sec\s*$")


def ctest_rows(log_text):
    """One row per test line of ctest's output (name, result, seconds)."""
    rows = []
    for line in log_text.splitlines():
        m = CTEST_LINE.match(line)
        if m:
            name, result, secs = m.groups()
            rows.append({"case": f"ctest_{name}", "pass": result == "Passed", "result": result,
                         "seconds": float(secs)})
    return rows


# ---- memcheck: the GPU CTests under compute-sanitizer ------------------------------

def gpu_ctests(build_dir):
    """The CTests of label "gpu" as ctest lists them: name, command, working
    directory, environment, the regular expression that marks a skip."""
    listing = subprocess.run(["ctest", "--test-dir", build_dir, "-L", "gpu", "--show-only=json-v1"],
                             capture_output=True, text=True, check=True).stdout
    tests = []
    for t in json.loads(listing).get("tests", []):
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        skip = props.get("SKIP_REGULAR_EXPRESSION") or []
        tests.append({"name": t["name"], "command": t.get("command", []),
                      "cwd": props.get("WORKING_DIRECTORY"), "env": props.get("ENVIRONMENT") or [],
                      "skip": skip if isinstance(skip, list) else [skip]})
    return tests


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


def run_in_group(cmd, cwd, env, log_path, timeout):
    """cmd in a process group of its own, output to log_path; at the timeout
    the whole group (mpirun and its ranks too) is ended. (exit code, timed out)."""
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return p.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                try:
                    os.killpg(p.pid, sig)
                    return p.wait(timeout=wait), True
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            return None, True


def memcheck(build_dir, sanitizer, log_dir, test_timeout, budget, jobs=1):
    """Every GPU CTest once under compute-sanitizer memcheck, `jobs` at a
    time; prints a row per test as it ends (a stage cut short keeps those).
    0 when all pass."""
    t_start = time.monotonic()
    tests = gpu_ctests(build_dir)
    if not tests:
        print(json.dumps({"case": "memcheck", "pass": False, "why": "no CTest of label gpu in this build"}))
        return 1
    args = [sanitizer, "--tool", "memcheck", "--error-exitcode", "97"]
    lock = threading.Lock()

    def one(t):
        row = {"case": f"memcheck_{t['name']}"}
        left = budget - (time.monotonic() - t_start)
        cmd = sanitized_command(t["command"], build_dir, args)
        if cmd is None:
            row.update({"pass": False, "why": "no test binary in its command"})
        elif left < 20:
            row.update({"pass": False, "why": "not run: no time left in the stage"})
        else:
            env = dict(os.environ)
            env.update(kv.split("=", 1) for kv in t["env"] if "=" in kv)
            log_path = os.path.join(log_dir, f"memcheck_{t['name']}.log")
            t0 = time.monotonic()
            code, timed_out = run_in_group(cmd, t["cwd"], env, log_path, min(test_timeout, left))
            with open(log_path, errors="replace") as f:
                ok, errors, why = sanitizer_verdict(f.read(), code, t["skip"])
            if timed_out:
                ok, why = False, f"timed out after {min(test_timeout, left):.0f} s"
            row.update({"pass": ok, "errors": errors, "exit": code, "seconds": round(time.monotonic() - t0, 1)})
            if why:
                row["why"] = why
        with lock:
            print(json.dumps(row), flush=True)
        return row["pass"]

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        passed = list(pool.map(one, tests))
    return 0 if all(passed) else 1


# ---- a build kept between calls -----------------------------------------------

SKIP_DIRS = {"out", "__pycache__"}


def source_files(root):
    """Every file of the tree the build reads: all but the build folders,
    hidden folders (.git, .gpu_deps) and out/."""
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "build")) and d not in SKIP_DIRS)
        for name in sorted(files):
            yield os.path.relpath(os.path.join(top, name), root)


def file_hash(path):
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_mtimes(stamp, root):
    """After a build: each source's hash and mtime (ns)."""
    lines = [f"{file_hash(os.path.join(root, f))} {os.stat(os.path.join(root, f)).st_mtime_ns} {f}\n"
             for f in source_files(root)]
    with open(stamp, "w") as out:
        out.writelines(lines)
    return len(lines)


def restore_mtimes(stamp, root):
    """Before a build: the recorded mtime back on each source whose bytes are
    those of the last build, so that ninja, which compares mtimes, rebuilds
    only what changed even when the tree was copied afresh. The number of
    files whose mtime was put back."""
    if not os.path.exists(stamp):
        return 0
    restored = 0
    with open(stamp) as f:
        for line in f:
            digest, mtime, rel = line.rstrip("\n").split(" ", 2)
            path = os.path.join(root, rel)
            try:
                st = os.stat(path)
                if st.st_mtime_ns != int(mtime) and file_hash(path) == digest:
                    os.utime(path, ns=(st.st_atime_ns, int(mtime)))
                    restored += 1
            except OSError:
                continue
    return restored


# ---- reports: the rows of the stages, one call's summary, several calls ---------

def git_commit():
    """The commit measured: MP_GPU_CHECK_COMMIT, else git (with -dirty when
    tracked files differ from it), else .gpu_deps/commit (scripts/gpu_deps
    writes it where git works, for a checkout copied without .git)."""
    if os.environ.get("MP_GPU_CHECK_COMMIT"):
        return os.environ["MP_GPU_CHECK_COMMIT"]
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7", "--match", "NO_TAGS"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        with open(os.path.join(ROOT, ".gpu_deps", "commit")) as f:
            return f.read().split()[0]
    except (OSError, IndexError):
        return "unknown"


def read_rows(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    rows.append(json.loads(line))
    return rows


HEADLINE_CASES = re.compile(r"^(peak_|step_gemms_)")


def row_line(stage, r):
    verdict = {True: "PASS", False: "FAIL"}.get(r.get("pass"), "    ")
    keys = [k for k in r if k not in ("case", "pass", "suite", "missed", "why")][:6]
    keys += [k for k in ("missed", "why") if k in r]
    return f"  {verdict} {stage:8} {r.get('case', '?'):34} " + ", ".join(f"{k}={r[k]}" for k in keys)


def print_rows(stage, rows, compact=False):
    """The table's lines of one stage; the number of rows that failed.
    compact (the summary a call prints last): every failed row; the passed
    ones and the measurements only while there are few (else a count, and
    the headline measurements: the GEMM peak and step rows)."""
    failed = sum(r.get("pass") is False for r in rows)
    passed = [r for r in rows if r.get("pass") is True]
    plain = [r for r in rows if "pass" not in r]
    left_out = 0
    for r in rows:
        if compact and ((r in passed and len(passed) > 6) or
                        (r in plain and len(plain) > 8 and not HEADLINE_CASES.match(r.get("case", "")))):
            left_out += 1
            continue
        print(row_line(stage, r))
    if left_out:
        print(f"  .... {stage:8} {left_out} more rows (passed, or measurements): gpu_check_summary.json")
    return failed


def write_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def report(state_dir, out_json):
    result = {"commit": git_commit(), "stages": {}}
    for name in sorted(os.listdir(state_dir)):
        if name.endswith(".jsonl"):
            result["stages"][name[:-len(".jsonl")]] = read_rows(os.path.join(state_dir, name))
    write_json(out_json, result)
    print(f"gpu_check report, commit {result['commit']}: {out_json}")
    failed = sum(print_rows(stage, rows) for stage, rows in result["stages"].items())
    return 1 if failed else 0


STATUSES = ("pass", "fail", "timeout", "interrupted", "skipped", "running", "pending")


def machine(state_dir, device):
    """The GPU, its driver and the CUDA compiler (read once per machine)."""
    cache = os.path.join(state_dir, "machine.json")
    if os.path.exists(cache):
        with open(cache) as f:
            return json.load(f)
    info = {"host_cpus": os.cpu_count()}
    if device == "CUDA":
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        for key, cmd in (("gpu", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                  "--format=csv,noheader"]), ("nvcc", [nvcc, "--version"])):
            try:
                text = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
                info[key] = text.splitlines()[-1 if key == "nvcc" else 0] if text else None
            except (OSError, subprocess.TimeoutExpired):
                info[key] = None
        write_json(cache, info)
    return info


def call_summary(state_dir, call_tsv, device, tarball, seconds, deadline, final):
    """One call's summary: each stage's status (STATUSES), seconds, note and
    result rows; "result": pass (every stage passed, every judged row too),
    fail (a stage failed or a row missed its target), or incomplete (else: a
    stage timed out, was interrupted, skipped or has not run yet)."""
    stages = {}
    with open(call_tsv) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 2:
                continue
            stage, status = parts[0], parts[1]
            entry = {"status": status, "seconds": int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0}
            if len(parts) > 3 and parts[3]:
                entry["note"] = parts[3]
            if status not in ("pending", "skipped") and stage != "report":
                entry["rows"] = read_rows(os.path.join(state_dir, f"{stage}.jsonl"))
            stages[stage] = entry
    rows_failed = any(r.get("pass") is False for e in stages.values() for r in e.get("rows", []))
    if any(e["status"] == "fail" for e in stages.values()) or rows_failed:
        result = "fail"
    elif all(e["status"] == "pass" for e in stages.values()):
        result = "pass"
    else:
        result = "incomplete"
    return {"commit": git_commit(), "device": device, "machine": machine(state_dir, device),
            "stages_asked": list(stages), "result": result, "final": final, "seconds": seconds,
            "deadline_s": deadline, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tarball": tarball, "stages": stages}


def print_summary(s):
    gpu = (s.get("machine") or {}).get("gpu") or s.get("device")
    print(f"gpu_check summary: {s['result'].upper()}, stages {' '.join(s['stages_asked'])}, commit {s['commit']}, "
          f"{gpu}, {s['seconds']} s")
    for stage, e in s["stages"].items():
        note = f" ({e['note']})" if e.get("note") else ""
        print(f"  {e['status']:11} {stage:8} {e['seconds']:4d} s{note}")
        print_rows(stage, e.get("rows", []), compact=True)


def merge(out_json, summaries):
    """Several calls' summaries in one report: the last run of each stage."""
    result = {"commit": None, "machine": None, "calls": [], "stages": {}}
    commits = []
    for path in summaries:
        with open(path) as f:
            s = json.load(f)
        commits.append(s.get("commit", "unknown"))
        result["machine"] = s.get("machine") or result["machine"]
        result["calls"].append({k: s.get(k) for k in ("stages_asked", "result", "final", "seconds", "finished_at")}
                               | {"status": {st: e["status"] for st, e in s.get("stages", {}).items()}})
        for stage, e in s.get("stages", {}).items():
            if e["status"] not in ("pending", "skipped") and stage != "report":
                result["stages"][stage] = e.get("rows", []) + ([] if e["status"] == "pass" else [
                    {"case": f"{stage}_stage", "pass": False, "status": e["status"], "note": e.get("note", "")}])
    result["commit"] = commits[-1] if len(set(commits)) == 1 else ",".join(commits)
    write_json(out_json, result)
    print(f"gpu_check merge of {len(summaries)} call(s), commit {result['commit']}: {out_json}")
    failed = sum(print_rows(stage, rows) for stage, rows in result["stages"].items())
    if len(set(commits)) > 1:
        print("gpu_check merge: the calls measured different commits")
        failed += 1
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("agree")
    a.add_argument("gpu_dir")
    a.add_argument("cpu_dir")
    a.add_argument("--recipe", required=True)
    s = sub.add_parser("speed")
    s.add_argument("run_dir")
    s.add_argument("--peak-tflops", type=float, required=True)
    s.add_argument("--torch")
    s.add_argument("--skip", type=int, default=5)
    s.add_argument("--batch", type=int, help="the run's batch: its targets, and PyTorch's rows at it")
    s.add_argument("--log", help="the worker's log: the ops per step and the GEMM plans")
    s.add_argument("--put", help="also put the row into this JSON lines file, in place of one of its case")
    s.add_argument("--no-judge", action="store_true", help="report, judge no target")
    gm = sub.add_parser("gemm")
    gm.add_argument("log")
    gm.add_argument("--exit", type=int, default=0, help="mp_bench's exit status")
    m = sub.add_parser("smoke")
    m.add_argument("run_dir")
    m.add_argument("log")
    m.add_argument("--steps", type=int, required=True)
    c = sub.add_parser("ctest-rows")
    c.add_argument("log")
    k = sub.add_parser("memcheck")
    k.add_argument("build_dir")
    k.add_argument("sanitizer")
    k.add_argument("log_dir")
    k.add_argument("--test-timeout", type=float, default=150)
    k.add_argument("--budget", type=float, default=600)
    k.add_argument("--jobs", type=int, default=1)
    r = sub.add_parser("report")
    r.add_argument("state_dir")
    r.add_argument("out_json")
    u = sub.add_parser("summary")
    u.add_argument("state_dir")
    u.add_argument("call_tsv")
    u.add_argument("out_json")
    u.add_argument("--device", default="CUDA")
    u.add_argument("--tarball", default="")
    u.add_argument("--seconds", type=int, default=0)
    u.add_argument("--deadline", type=int, default=0)
    u.add_argument("--print", action="store_true", help="the last write of the call: print the table")
    sub.add_parser("commit")
    mt = sub.add_parser("mtimes")
    mt.add_argument("action", choices=["save", "restore"])
    mt.add_argument("stamp")
    mt.add_argument("root", nargs="?", default=ROOT)
    g = sub.add_parser("merge")
    g.add_argument("out_json")
    g.add_argument("summaries", nargs="+")
    args = ap.parse_args()
    if args.cmd == "agree":
        row = agree(args.gpu_dir, args.cpu_dir, args.recipe)
        print(json.dumps(row))
        return 0 if row["pass"] else 1
    if args.cmd == "speed":
        row = speed(args.run_dir, args.peak_tflops, args.torch, args.skip, args.batch, args.log, not args.no_judge)
        if args.put:
            put_row(args.put, row)
        print(json.dumps(row))
        return 1 if "why" in row else 0
    if args.cmd == "gemm":
        with open(args.log, errors="replace") as f:
            rows = gemm_rows(f.read(), args.exit)
        for row in rows:
            print(json.dumps(row))
        return 1 if any(r.get("pass") is False for r in rows) else 0
    if args.cmd == "smoke":
        row = smoke(args.run_dir, args.log, args.steps)
        print(json.dumps(row))
        return 0 if row["pass"] else 1
    if args.cmd == "ctest-rows":
        with open(args.log, errors="replace") as f:
            for row in ctest_rows(f.read()):
                print(json.dumps(row))
        return 0
    if args.cmd == "memcheck":
        return memcheck(args.build_dir, args.sanitizer, args.log_dir, args.test_timeout, args.budget, args.jobs)
    if args.cmd == "summary":
        s = call_summary(args.state_dir, args.call_tsv, args.device, args.tarball, args.seconds, args.deadline,
                         args.print)
        write_json(args.out_json, s)
        if args.print:
            print_summary(s)
        return 0
    if args.cmd == "mtimes":
        if args.action == "save":
            print(f"gpu_check: {save_mtimes(args.stamp, args.root)} sources recorded in {args.stamp}")
        else:
            print(f"gpu_check: the mtimes of {restore_mtimes(args.stamp, args.root)} unchanged sources put back")
        return 0
    if args.cmd == "commit":
        print(git_commit())
        return 0
    if args.cmd == "merge":
        return merge(args.out_json, args.summaries)
    return report(args.state_dir, args.out_json)


if __name__ == "__main__":
    sys.exit(main())

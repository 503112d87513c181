"""The stages that build and run the CTests: build, tests, memcheck."""
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import threading
import time

from . import env as envmod
from . import judge

GPU_TEST_TARGETS = ["mp_gpu_tests", "mp_gpu_nccl_tests", "mp_gpu_staged_tests", "mp_gpu_engine_tests"]
TESTS_STOP_S = 15     # the GPU tests are ended this long before the tests stage's end
STACKS_BEFORE_S = 40  # and the stacks of those still running are taken this long before it


def targets_for(stages, has_python_target):
    """The targets the call's stages run (all of them for a call of build alone)."""
    asked = set(stages) - {"build"} or {"tests", "smoke", "gemm"}
    targets = []
    if asked & {"tests", "memcheck"}:
        targets += GPU_TEST_TARGETS + (["_mp"] if has_python_target else [])
    if asked & {"smoke", "agree", "faults", "gpt2"}:
        targets.append("mp_worker")
    if asked & {"gemm", "update"}:
        targets.append("mp_bench")
    return targets


def build(ctx, st):
    s, run = ctx.s, ctx.runner
    if s.device == "CUDA":
        ctx.say(envmod.query(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv"]) or "nvidia-smi: no answer", echo=False)
    ctx.say("machine: " + json.dumps(envmod.machine(s.device)) + f"; nproc {os.cpu_count()}; libraries "
            + json.dumps(ctx.libraries), echo=False)
    t0 = time.monotonic()
    stamp = os.path.join(s.build, ".gpu_check_sources")
    fresh = not os.path.exists(os.path.join(s.build, "build.ninja"))
    if not fresh:
        # A tree copied afresh over a kept build folder has new mtimes on the
        # same bytes: those of the last build go back, so ninja rebuilds what changed.
        ctx.say(f"the mtimes of {envmod.restore_mtimes(stamp, s.root)} unchanged sources put back", echo=False)
    else:
        # CMAKE_POLICY_VERSION_MINIMUM: a CMake 4 there refuses package configs
        # (oneDNN's, GTest's) that still declare pre-3.5 minimums.
        cuda = "ON" if s.device == "CUDA" else "OFF"
        r = run.run("cmake", ["cmake", "-S", s.root, "-B", s.build, "-G", "Ninja", f"-DMP_CUDA={cuda}",
                              "-DMP_WERROR=OFF", "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CUDA_ARCHITECTURES=90",
                              "-DCMAKE_POLICY_VERSION_MINIMUM=3.5"] + ctx.cmake_args)
        if not r.ok:
            return False
    # The Python package too where python3 has nanobind (its CUDA test has labels gpu and python).
    help_text = subprocess.run(["cmake", "--build", s.build, "--target", "help"], capture_output=True,
                               text=True, env=ctx.env).stdout
    targets = targets_for(ctx.stages, re.search(r"^(\.\.\. )?_mp(:|$)", help_text, re.M) is not None)
    ctx.say(f"targets: {' '.join(targets)}", echo=False)
    r = run.run("compile", ["cmake", "--build", s.build, "-j", str(os.cpu_count()), "--target"] + targets)
    if not r.ok:
        return False
    ctx.say(f"{envmod.save_mtimes(stamp, s.root)} sources recorded in {stamp}", echo=False)
    st.row({"case": "build", "pass": True, "fresh": fresh, "seconds": round(time.monotonic() - t0),
            "jobs": os.cpu_count(), "targets": len(targets)})
    return True


def stacks(ctx, name):
    """Where each process still running from the build's tests or workers
    waits, into logs/NAME.log: every thread's backtrace through cuda-gdb (the
    CUDA image has no gdb), or where it has none, each thread's name and
    kernel wait channel. At most 30 s."""
    build = ctx.s.build + os.sep
    gdb = shutil.which("cuda-gdb") or shutil.which("gdb") or "/usr/local/cuda/bin/cuda-gdb"
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")[0].decode(errors="replace")
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except (OSError, ValueError):
            continue
        if cmd.startswith(build) and re.search(r"(tests/mp_|mp_worker)", cmd) and \
                not re.fullmatch(r"mprun|mpirun|orterun|prterun|prte|bash|sh|timeout|python3?", comm):
            pids.append(entry)
    if not pids:
        return
    ctx.say(f"where {len(pids)} processes still running wait: logs/{name}.log")

    def one(pid):
        text = f"==== pid {pid}\n"
        if os.access(gdb, os.X_OK):
            try:
                text += subprocess.run([gdb, "-q", "-batch", "-p", pid, "-ex", "thread apply all bt"],
                                       capture_output=True, text=True, timeout=25).stdout
            except subprocess.TimeoutExpired:
                text += "(the debugger took over 25 s)\n"
        else:
            for t in sorted(os.listdir(f"/proc/{pid}/task")):
                try:
                    comm = open(f"/proc/{pid}/task/{t}/comm").read().strip()
                    wchan = open(f"/proc/{pid}/task/{t}/wchan").read().strip()
                except OSError:
                    continue
                text += f"thread {t} {comm}: {wchan}\n"
        return text

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        texts = list(pool.map(one, pids))
    with open(os.path.join(ctx.s.logs, f"{name}.log"), "w") as f:
        f.write("".join(texts))


def tests(ctx, st):
    """Every CTest of label gpu, all at once, each ended TESTS_STOP_S before
    the stage's end whatever its own TIMEOUT (ctest --stop-time), a row per
    test as it ends."""
    s = ctx.s
    stop_at = st.deadline - min(TESTS_STOP_S, st.limit_s / 4)
    watchdog = None
    if st.limit_s > 2 * STACKS_BEFORE_S:
        watchdog = threading.Timer(st.deadline - STACKS_BEFORE_S - time.monotonic(), stacks, (ctx, "stacks_tests"))
        watchdog.daemon = True
        watchdog.start()
    stop_clock = time.strftime("%H:%M:%S", time.localtime(time.time() + stop_at - time.monotonic()))
    rows = []

    def on_line(line):
        row = judge.ctest_row(line)
        if row:
            rows.append(row)
            st.row(row)

    try:
        r = ctx.runner.run("ctest_gpu", ["ctest", "--test-dir", s.ctest_dir, "-L", "gpu", "--output-on-failure",
                                         "-V", "-j", str(s.test_jobs), "--stop-time", stop_clock],
                           on_line=on_line)
    finally:
        if watchdog:
            watchdog.cancel()
    # CTest's verdict (no device: "no CUDA device: "), not a GoogleTest skip of
    # one case the kernels do not support (a flash attention head size).
    skipped = sum(row["result"] == "Skipped" for row in rows)
    stopped = [row["case"][len("ctest_"):] for row in rows if row["result"] == "Timeout"]
    ok = r.ok and bool(rows)
    if skipped:
        ctx.say("GPU tests were skipped: the device is not usable")
        ok = False
    if stopped:
        st.note(f"ended {round(st.deadline - stop_at)} s before the stage's end: {' '.join(stopped)}")
    st.row({"case": "ctest_gpu", "pass": ok, "tests": len(rows), "skipped": skipped, "timed_out": len(stopped)})
    n = envmod.gpu_count() if s.device == "CUDA" else 0
    if n > 1:
        r2 = ctx.runner.run("nccl_all_gpus", ctx.runner.ranks(n, [os.path.join(s.build, "tests", "mp_gpu_engine_tests"),
                                                                  "--gtest_filter=*Nccl*"]))
        st.row({"case": f"nccl_engine_{n}_gpus", "pass": r2.ok})
        ok = ok and r2.ok
    return ok


def gpu_ctests(ctest_dir):
    """The CTests of label "gpu" as ctest lists them: name, command, working
    directory, environment, the regular expression that marks a skip."""
    listing = subprocess.run(["ctest", "--test-dir", ctest_dir, "-L", "gpu", "--show-only=json-v1"],
                             capture_output=True, text=True, check=True).stdout
    found = []
    for t in json.loads(listing).get("tests", []):
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        skip = props.get("SKIP_REGULAR_EXPRESSION") or []
        found.append({"name": t["name"], "command": t.get("command", []), "cwd": props.get("WORKING_DIRECTORY"),
                      "env": props.get("ENVIRONMENT") or [], "skip": skip if isinstance(skip, list) else [skip]})
    return found


def sanitizer():
    """The path of compute-sanitizer (it ships with the CUDA toolkit)."""
    for c in (shutil.which("compute-sanitizer"), "/usr/local/cuda/bin/compute-sanitizer",
              "/usr/local/cuda/compute-sanitizer/compute-sanitizer"):
        if c and os.access(c, os.X_OK):
            return c
    return None


def memcheck(ctx, st, list_tests=gpu_ctests, find_sanitizer=sanitizer):
    """Every GPU CTest once under compute-sanitizer memcheck,
    MP_GPU_CHECK_MEMCHECK_JOBS at a time, a row per test as it ends."""
    s = ctx.s
    cs = find_sanitizer()
    if not cs:
        ctx.say("compute-sanitizer not found (PATH, /usr/local/cuda/bin)")
        return False
    ctx.say(f"{cs}: " + (envmod.query([cs, "--version"]) or "").replace("\n", "; "), echo=False)
    found = list_tests(s.ctest_dir)
    if not found:
        st.row({"case": "memcheck", "pass": False, "why": "no CTest of label gpu in this build"})
        return False
    args = [cs, "--tool", "memcheck", "--error-exitcode", "97"]

    def one(t):
        row = {"case": f"memcheck_{t['name']}"}
        left = st.left() - 15
        cmd = judge.sanitized_command(t["command"], s.build, args)
        if cmd is None:
            row.update({"pass": False, "why": "no test binary in its command"})
        elif left < 20:
            row.update({"pass": False, "why": "not run: no time left in the stage"})
        else:
            env = dict(kv.split("=", 1) for kv in t["env"] if "=" in kv)
            limit = min(s.memcheck_test_s, left)
            r = ctx.runner.run(f"memcheck_{t['name']}", cmd, timeout=limit, env=env, cwd=t["cwd"], tail=0)
            ok, errors, why = judge.sanitizer_verdict(ctx.log_text(f"memcheck_{t['name']}"), r.rc, t["skip"])
            if r.timed_out:
                ok, why = False, f"timed out after {limit:.0f} s"
            row.update({"pass": ok, "errors": errors, "exit": r.rc, "seconds": round(r.seconds, 1)})
            if why:
                row["why"] = why
        st.row(row)
        return row["pass"]

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, s.memcheck_jobs)) as pool:
        passed = list(pool.map(one, found))
    if not all(passed):
        ctx.say("memcheck failed: logs/memcheck_<test>.log name the kernel and the address")
    return all(passed)

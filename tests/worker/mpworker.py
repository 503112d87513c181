"""mp_worker as the end-to-end tests run it, and what a run leaves, as data.

`Worker` runs mp_worker as users do: bare (world size 1) or under
launch/mprun -np N --bind-to none, each run with a deadline (the run's
process group is ended when it passes, as `timeout -k 5` does), its output
in a log file of its own. `Run` is what came back: the exit code, the
seconds it took, the log. What a run directory holds (docs/training.md,
docs/checkpoints.md) is read as data: `metrics()` gives metrics.jsonl's
records, `Checkpoints` the checkpoint root (`latest`, the committed steps,
the partial `.tmp-step_N` directories, each manifest's step, world size and
strategy, the shard files).

The fixtures (`worker`, `measured`) and the command-line options are shared
by the test directories through their conftest.py:
  --worker PATH         the mp_worker binary ($MP_WORKER, else build/mp_worker)
  --mprun PATH          the launcher (launch/mprun)
  --worker-args WORDS   added to every worker run (e.g. --set checkpoint.async_save=true)
  --rounds N            rounds of the random-SIGKILL test (10)
"""
import json
import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]

# How long after its launcher ends a worker process still there counts as left running.
LEFT_RUNNING_GRACE_S = 1.0

# The small GPT the multi-rank cases train: each run takes about a second.
SMALL_GPT = ["--set", "model.gpt.layers=2", "--set", "model.gpt.context=32", "--set", "log_interval=1"]


def sets(*assignments):
    """sets("a=1", "b=2") -> ["--set", "a=1", "--set", "b=2"]."""
    return [word for a in assignments for word in ("--set", a)]


def step_dir(step):
    return f"step_{step:08d}"


# ---- running the worker ---------------------------------------------------------


@dataclass(repr=False)
class Run:
    """One finished worker run: what it was asked, how it ended, its log."""
    name: str
    argv: list
    rc: int
    seconds: float
    log_path: Path
    left_running: list  # worker processes of the run (or the session) still there when the launcher ended
    log: str = field(repr=False)  # its output, stdout and stderr together

    def lines(self, pattern):
        """The log's lines that match the regex `pattern` (re.search)."""
        return [line for line in self.log.splitlines() if re.search(pattern, line)]

    def tail(self, n=30):
        return "\n".join(self.log.splitlines()[-n:])

    def __str__(self):
        return (f"run '{self.name}' ({shlex.join(map(str, self.argv))}) exited {self.rc} after "
                f"{self.seconds:.1f} s; last lines of {self.log_path}:\n{self.tail()}")

    def __repr__(self):
        return f"<run '{self.name}': exit {self.rc}>"


class Outcome(SimpleNamespace):
    """What a fixture hands the cases: its run and what was read after it."""

    def __repr__(self):
        run = getattr(self, "run", None)
        return f"<outcome of {run!r}>" if run else "<outcome>"


def logged(run, pattern):
    """The lines of run's log that match the regex; fails naming the pattern
    and the log's tail when none does."""
    found = run.lines(pattern)
    if not found:
        pytest.fail(f"no line matches /{pattern}/ in the log of {run}", pytrace=False)
    return found


def not_logged(run, pattern):
    """Fails, naming the lines, when run's log has a line that matches."""
    found = run.lines(pattern)
    if found:
        pytest.fail(f"lines match /{pattern}/: {found} in the log of {run}", pytrace=False)


def workers_running(marker, sid=None):
    """Process ids of mp_worker processes (argv[0] ends in mp_worker, so not
    mpirun) in the session `sid` (a job's: its launcher started one, and
    ranks on this host stay in it) or whose command line names `marker`
    (the scratch directory every run directory is under: ranks a launcher
    started elsewhere, on an emulated cluster's hosts)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
            session = int(Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()[3])
        except (OSError, IndexError, ValueError):
            continue
        if argv and os.path.basename(argv[0]) == b"mp_worker" and (
                session == sid or (marker is not None and any(marker.encode() in a for a in argv[1:]))):
            pids.append(int(entry))
    return pids


def _end_group(p, grace_s=5):
    """SIGTERM to the process group, SIGKILL after grace_s, as timeout -k does."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return p.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    return p.wait()


class Job:
    """A worker run started in the background (see Worker.start)."""

    def __init__(self, worker, name, argv, log_path, env, timeout):
        self.worker, self.name, self.argv, self.log_path, self.timeout = worker, name, argv, log_path, timeout
        self.log_file = open(log_path, "wb")
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log_file, stderr=subprocess.STDOUT,
                                  env=env, start_new_session=True)
        worker.jobs.append(self)

    def ranks(self):
        """The job's worker processes on this host (its ranks, while it runs)."""
        return workers_running(None, sid=self.p.pid)

    def left(self):
        """Worker processes of this job, or of this test session, still there."""
        return workers_running(self.worker.marker, sid=self.p.pid)

    def wait(self):
        """Waits for the end; past the deadline, ends the run's process group
        and fails with the log's tail."""
        try:
            rc = self.p.wait(timeout=max(0.0, self.timeout - (time.monotonic() - self.t0)))
            timed_out = False
        except subprocess.TimeoutExpired:
            rc, timed_out = _end_group(self.p), True
        seconds = time.monotonic() - self.t0
        self.log_file.close()
        left = self.left()
        t0 = time.monotonic()
        while left and time.monotonic() - t0 < LEFT_RUNNING_GRACE_S:  # a rank its launcher ended may be exiting
            time.sleep(0.05)
            left = self.left()
        for pid in left:  # the next run must not meet them
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        run = Run(self.name, self.argv, rc, seconds, self.log_path, left,
                  self.log_path.read_text(errors="replace"))
        if timed_out:
            pytest.fail(f"still running after {self.timeout} s: {run}", pytrace=False)
        return run


class Worker:
    """Runs mp_worker. Every run's argv is the binary, `base` (the case's
    common flags), the session's --worker-args, then the run's own args;
    logs go to `logs`, and `marker` (the scratch directory, which every run
    directory is under) tells this session's worker processes apart."""

    def __init__(self, binary, mprun, extra, logs, marker, base=(), jobs=None):
        self.binary, self.mprun, self.extra = str(binary), str(mprun), list(extra)
        self.logs, self.marker, self.base = Path(logs), marker, list(base)
        self.jobs = [] if jobs is None else jobs  # every Job started, shared with with_base's copies

    def with_base(self, *base):
        return Worker(self.binary, self.mprun, self.extra, self.logs, self.marker, [*self.base, *base], self.jobs)

    def end_jobs(self):
        """Ends the process group of every job still running (a case that
        failed while its job ran)."""
        for job in self.jobs:
            if job.p.poll() is None:
                _end_group(job.p)

    def argv(self, args, np=2):
        worker = [self.binary, *map(str, [*self.base, *self.extra, *args])]
        return worker if np is None else [self.mprun, "-np", str(np), "--bind-to", "none", *worker]

    def _env(self, env):
        merged = dict(os.environ)
        for k, v in (env or {}).items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = v
        return merged

    def start(self, name, args, np=2, env=None, timeout=120):
        """Starts a run in the background; Job.wait() ends it. np=None: bare."""
        return Job(self, name, self.argv(args, np), self.logs / f"{name}.log", self._env(env), timeout)

    def run(self, name, args, np=2, env=None, timeout=120):
        """A run to its end (at most `timeout` s), its log in LOGS/NAME.log."""
        return self.start(name, args, np, env, timeout).wait()

    def command(self, name, argv, env=None, timeout=120):
        """Any command (scripts/cluster, say) to its end, its log in LOGS/NAME.log."""
        return Job(self, name, list(map(str, argv)), self.logs / f"{name}.log", self._env(env), timeout).wait()

    def verify(self, name, root):
        """mp_worker --verify-checkpoint ROOT (bare, nothing else on its command line)."""
        return self.command(name, [self.binary, "--verify-checkpoint", root], timeout=60)


def wait_for(condition, timeout_s, what, poll_s=0.05):
    """Polls until condition() is true; fails naming `what` after timeout_s."""
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout_s:
            pytest.fail(f"waited {timeout_s} s for {what}", pytrace=False)
        time.sleep(poll_s)


# ---- what a run directory holds ------------------------------------------------


def metrics(run_dir):
    """metrics.jsonl's records, in file order (an empty list without the file)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def metrics_lines(run_dir):
    """metrics.jsonl's lines as written (timings included)."""
    path = Path(run_dir) / "metrics.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def losses(records):
    """(step, loss, grad_norm) per record: what bit-for-bit comparisons compare."""
    return [(r["step"], r["loss"], r["grad_norm"]) for r in records]


def steps(records):
    return [r["step"] for r in records]


def _strategies():
    """ShardingConfig.Strategy's values, from proto/mp.proto."""
    text = (ROOT / "proto" / "mp.proto").read_text()
    block = re.search(r"enum Strategy \{(.*?)\}", text, re.S).group(1)
    return {int(v): name for name, v in re.findall(r"(\w+) = (\d+);", block)}


def _varint(data, i):
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def read_manifest(path):
    """The scalar fields of a checkpoint's manifest.pb (Note [Checkpoint
    format]: a 32-byte header "MPCKMANI" ..., u64 payload bytes at offset 16,
    then a binary CheckpointManifest): step, world_size, strategy."""
    data = Path(path).read_bytes()
    assert data[:8] == b"MPCKMANI", f"{path}: not a checkpoint manifest"
    payload = data[32:32 + int.from_bytes(data[16:24], "little")]
    fields, i = {}, 0
    while i < len(payload):
        key, i = _varint(payload, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields[number], i = _varint(payload, i)
        elif wire == 2:
            n, i = _varint(payload, i)
            i += n
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise AssertionError(f"{path}: wire type {wire} at byte {i}")
    return {"step": fields.get(3, 0), "world_size": fields.get(4, 0),
            "strategy": _strategies()[fields.get(6, 0)]}


class Checkpoints:
    """A checkpoint root (ROOT/latest, ROOT/step_N/, ROOT/.tmp-step_N/)."""

    def __init__(self, root):
        self.root = Path(root)

    @property
    def latest(self):
        """What `latest` names (step_00000012), or None."""
        path = self.root / "latest"
        return path.read_text().strip() if path.exists() else None

    @property
    def latest_step(self):
        return int(self.latest.removeprefix("step_")) if self.latest else None

    @property
    def steps(self):
        """The committed checkpoints' steps."""
        if not self.root.is_dir():
            return []
        return sorted(int(p.name[5:]) for p in self.root.glob("step_*") if p.is_dir())

    @property
    def partial(self):
        """Names of the .tmp-step_N directories an interrupted save left."""
        return sorted(p.name for p in self.root.glob(".tmp-*")) if self.root.is_dir() else []

    def path(self, step):
        return self.root / step_dir(step)

    def manifest(self, step):
        return read_manifest(self.path(step) / "manifest.pb")

    def shard(self, step, rank):
        return (self.path(step) / f"shard_{rank:05d}.bin").read_bytes()


# ---- the options and fixtures the conftest.py files share ----------------------


def add_options(parser):
    group = parser.getgroup("mp_worker")
    if any(o.names() == ["--worker"] for o in group.options):
        return  # tests/worker and tests/cluster in one session: added once
    group.addoption("--worker", default=os.environ.get("MP_WORKER", str(ROOT / "build" / "mp_worker")),
                    help="the mp_worker binary")
    group.addoption("--mprun", default=str(ROOT / "launch" / "mprun"), help="the launcher")
    group.addoption("--worker-args", default="", help="words added to every worker run")
    group.addoption("--rounds", type=int, default=10, help="rounds of the random-SIGKILL test")


_MEASURED = []


@pytest.fixture(scope="session")
def worker(request, tmp_path_factory):
    """A Worker on the session's scratch directory (--basetemp)."""
    binary = Path(request.config.getoption("--worker"))
    if not binary.is_file():
        pytest.fail(f"no mp_worker at {binary} (--worker)", pytrace=False)
    logs = tmp_path_factory.getbasetemp() / "logs"
    logs.mkdir(exist_ok=True)
    w = Worker(binary, request.config.getoption("--mprun"), shlex.split(request.config.getoption("--worker-args")),
               logs, str(tmp_path_factory.getbasetemp()))
    yield w
    w.end_jobs()


@pytest.fixture(scope="session")
def measured():
    """measured(line): a measurement printed at the end of the session."""
    return _MEASURED.append


def terminal_summary(terminalreporter):
    if _MEASURED:
        terminalreporter.section("measured")
        for line in _MEASURED:
            terminalreporter.write_line(line)
        _MEASURED.clear()  # printed once, though both conftest.py files call this

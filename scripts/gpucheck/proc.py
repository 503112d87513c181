"""Running the stages' commands: each in a process group of its own, its
output in a log, under its own timeout and its stage's deadline, and every
rank launch unbound.

A command's output goes straight to its log file (no pipe a leftover rank
could hold open); a caller that wants its lines as they come (rows written
as they are measured) gets each complete line through `on_line`.
"""
import os
import signal
import subprocess
import threading
import time

POLL_S = 0.2
TAIL_LINES = 25  # of a failed command's log, in the call's output
TERM_GRACE_S = 10  # SIGTERM, then SIGKILL this much later (a rank checkpointing on SIGTERM)
STOP_GRACE_S = 5   # the same when the call was stopped


class Stopped(Exception):
    """The call was told to stop (SIGTERM, SIGINT)."""


class StageTimedOut(Exception):
    """A command ran into its stage's deadline and was ended."""


class Result:
    def __init__(self, rc, timed_out, seconds):
        self.rc, self.timed_out, self.seconds = rc, timed_out, seconds

    @property
    def ok(self):
        return self.rc == 0 and not self.timed_out


class Runner:
    """Starts and ends the call's processes. `mprun`: the launcher
    (launch/mprun); `env`: the stages' environment; `say`: the call's log."""

    def __init__(self, root, logs, env, say):
        self.root, self.logs, self.env, self.say = root, logs, env, say
        self.mprun = os.path.join(root, "launch", "mprun")
        self.deadline = None  # time.monotonic() at which the stage in flight ends
        self._live = set()
        self._lock = threading.RLock()  # the signal handler runs on the main thread, which may hold it
        self._stopping = False

    def ranks(self, np, argv):
        """The command line that starts argv on `np` ranks. Never bound:
        Open MPI binds 1-2 ranks to one core each by default, which would put
        a rank's GPU host thread, its communication thread and NCCL's proxy
        on one core, against an unbound PyTorch."""
        return [self.mprun, "-np", str(np), "--bind-to", "none"] + list(argv)

    def run(self, name, argv, timeout=None, env=None, on_line=None, cwd=None, tail=TAIL_LINES):
        """argv with its output in logs/NAME.log; ended at `timeout` seconds
        (Result.timed_out) or at the stage's deadline (StageTimedOut), or when
        the call is stopped (Stopped). When it fails or is cut short, the last
        `tail` lines of its log go to the call's log and output."""
        if self._stopping:
            raise Stopped()
        full_env = dict(self.env)
        full_env.update(env or {})
        path = os.path.join(self.logs, f"{name}.log")
        self.say(f"$ {' '.join(argv)}  > logs/{name}.log", echo=False)
        t0 = time.monotonic()
        with open(path, "wb") as out:
            try:
                p = subprocess.Popen(argv, cwd=cwd or self.root, env=full_env, stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as e:
                out.write(f"gpu_check: cannot run {argv[0]}: {e}\n".encode())
                return Result(127, False, 0.0)
        with self._lock:
            self._live.add(p)
        lines = _LineTail(path, on_line) if on_line else None
        result = None
        try:
            result = self._wait(p, t0, timeout, lines)
            return result
        except StageTimedOut:
            self._tail(name, path, "was cut at the stage's end", tail)
            raise
        finally:
            with self._lock:
                self._live.discard(p)
            if lines:
                lines.poll(final=True)
            if result and not result.ok:
                how = f"timed out after {result.seconds:.0f} s" if result.timed_out else f"failed (exit {result.rc})"
                self._tail(name, path, how, tail)

    def _tail(self, name, path, how, lines):
        if not lines:
            return
        with open(path, errors="replace") as f:
            last = f.read().splitlines()[-lines:]
        self.say(f"{name} {how}; the end of logs/{name}.log:\n" + "\n".join(last))

    def _wait(self, p, t0, timeout, lines):
        while True:
            try:
                rc = p.wait(timeout=POLL_S)
                return Result(rc, False, time.monotonic() - t0)
            except subprocess.TimeoutExpired:
                pass
            if lines:
                lines.poll()
            now = time.monotonic()
            if self._stopping:
                end_group(p, STOP_GRACE_S)
                raise Stopped()
            if self.deadline is not None and now >= self.deadline:
                end_group(p, TERM_GRACE_S)
                raise StageTimedOut()
            if timeout is not None and now - t0 >= timeout:
                end_group(p, TERM_GRACE_S)
                return Result(p.returncode, True, now - t0)

    def left(self):
        """Seconds left before the stage's deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def stop(self):
        """The call was told to stop: SIGTERM to every process group in
        flight; their waits end them (SIGKILL after STOP_GRACE_S) and raise
        Stopped."""
        self._stopping = True
        with self._lock:
            live = list(self._live)
        for p in live:
            _signal_group(p.pid, signal.SIGTERM)

    @property
    def stopping(self):
        return self._stopping


def _signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def end_group(p, grace_s):
    """SIGTERM to p's process group, SIGKILL to it after grace_s."""
    _signal_group(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(p.pid, signal.SIGKILL)
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


class _LineTail:
    """The complete lines a log file gained since the last poll, to a callback."""

    def __init__(self, path, on_line):
        self.path, self.on_line, self.offset, self.partial = path, on_line, 0, b""

    def poll(self, final=False):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        if final and self.partial:
            complete.append(self.partial)
            self.partial = b""
        for line in complete:
            self.on_line(line.decode(errors="replace"))


def leftovers(patterns, own_pids):
    """Pids of processes whose command line contains one of `patterns`
    (the results folder; on a GPU machine the build folder's binaries),
    never one of own_pids (this program and the processes above it).
    mpirun starts its ranks in process groups of their own, so a rank (one
    that checkpoints on SIGTERM, say) can outlive an mpirun that was ended."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in own_pids:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(p in cmdline for p in patterns):
            found.append(int(entry))
    return found


def ancestors():
    """This process and every process above it."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def end_leftovers(patterns, say):
    """SIGTERM to the leftovers, SIGKILL to those still there after 5 s."""
    own = ancestors()
    pids = leftovers(patterns, own)
    if not pids:
        return
    say(f"ending processes left by the stage: {' '.join(map(str, pids))}")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for _ in range(25):
            pids = leftovers(patterns, own)
            if not pids:
                return
            time.sleep(0.2)

"""What a stage is handed: the call's context (settings, the runner, the
stages' environment) and its own run (its rows, notes and deadline)."""
import json
import os
import threading
import time

from . import report


class Context:
    """The call's context. say(text): a line of the call's log (and of its
    output unless echo=False)."""

    def __init__(self, settings, stages, commit, env, cmake_args, libraries, runner, log):
        self.s, self.stages, self.commit, self.env = settings, stages, commit, env
        self.cmake_args, self.libraries, self.runner = cmake_args, libraries, runner
        self._log = log
        self._lock = threading.RLock()  # the signal handler runs on the main thread, which may hold it

    def say(self, text, echo=True):
        line = f"gpu_check: {text}"
        with self._lock:
            with open(self._log, "a") as f:
                f.write(line + "\n")
        if echo:
            print(line, flush=True)

    def path(self, *parts):
        """A path in the results folder."""
        return os.path.join(self.s.state, *parts)

    def log_text(self, name):
        try:
            with open(os.path.join(self.s.logs, f"{name}.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def worker(self, argv, np=1):
        """mp_worker on `np` ranks (never bound: Runner.ranks)."""
        return self.runner.ranks(np, [os.path.join(self.s.build, "mp_worker")] + list(argv))

    def bench(self, argv):
        return self.runner.ranks(1, [os.path.join(self.s.build, "mp_bench")] + list(argv))


class StageRun:
    """One stage in a call: its rows go to STATE/NAME.jsonl as each is
    measured; its notes (what it left out, and why) to the summary."""

    def __init__(self, ctx, name, limit_s):
        self.ctx, self.name, self.limit_s = ctx, name, limit_s
        self.started = time.monotonic()
        self.deadline = self.started + limit_s
        self.notes = []
        self.rows_path = ctx.path(f"{name}.jsonl")
        self._lock = threading.Lock()

    def left(self):
        return self.deadline - time.monotonic()

    def row(self, row):
        """A result row, written at once."""
        with self._lock:
            report.append_row(self.rows_path, row)
        self.ctx.say(json.dumps(row), echo=False)

    def put(self, row):
        """A result row in place of an earlier one of its case."""
        with self._lock:
            report.put_row(self.rows_path, row)
        self.ctx.say(json.dumps(row), echo=False)

    def note(self, text):
        self.notes.append(text)
        self.ctx.say(text)

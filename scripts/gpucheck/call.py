"""One call of scripts/gpu_check: its stages in order under the call's
deadline, each stage's status, and its results handed back in two files
(written at the start, after every stage, on SIGTERM or SIGINT and on exit)."""
import glob
import os
import shutil
import signal
import time
import traceback

from . import build_stages, plan, report, run_stages
from . import env as envmod
from .context import Context, StageRun
from .proc import Runner, StageTimedOut, Stopped, end_leftovers

STAGE_FUNCTIONS = {
    "build": build_stages.build, "tests": build_stages.tests, "memcheck": build_stages.memcheck,
    "smoke": run_stages.smoke, "agree": run_stages.agree, "gemm": run_stages.gemm, "update": run_stages.update,
    "faults": run_stages.faults, "gpt2": run_stages.gpt2, "report": run_stages.report_stage,
}
SUMMARY = "gpu_check_summary.json"


class Call:
    def __init__(self, settings, stages, environ):
        self.s, self.stages, self.environ = settings, stages, environ
        self.status = {name: "pending" for name in stages}
        self.seconds, self.note, self.limit = {}, {}, {}
        self.current, self.current_t0 = None, 0.0
        self.t_start, self.since = time.monotonic(), time.time()
        self.tarball = plan.tarball_name(stages)
        self.stopping, self.writing = False, False
        self.log = os.path.join(settings.logs, "gpu_check.log")
        self.ctx = None

    def say(self, text, echo=True):
        if self.ctx:
            self.ctx.say(text, echo)
            return
        with open(self.log, "a") as f:
            f.write(f"gpu_check: {text}\n")
        if echo:
            print(f"gpu_check: {text}", flush=True)

    def elapsed(self):
        return time.monotonic() - self.t_start

    def run(self):
        """Runs the call; its exit status (0: every stage passed; 2: a stage
        name was wrong)."""
        s = self.s
        os.makedirs(s.logs, exist_ok=True)
        for f in glob.glob(os.path.join(s.logs, "*")):
            os.remove(f)
        os.makedirs(s.out, exist_ok=True)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        bad = plan.unknown(self.stages)
        if bad:
            self.say(f"unknown stage {' '.join(bad)} (stages: {' '.join(plan.ALL_STAGES)})")
            for name in self.stages:
                self.status[name], self.note[name] = "skipped", "a stage name was wrong: nothing ran"
            self.finish()
            return 2
        commit = envmod.git_commit(s.root, self.environ)
        env_error = None
        try:
            env, cmake_args, libraries = envmod.stage_environment(s, self.environ)
        except (OSError, ValueError) as e:
            env, cmake_args, libraries, env_error = dict(self.environ), [], {}, str(e)
        self.machine = envmod.machine(s.device)
        runner = Runner(s.root, s.logs, env, self.say)
        self.ctx = Context(s, self.stages, commit, env, cmake_args, libraries, runner, self.log)
        self.say(f"stages {' '.join(self.stages)} on {s.device}, commit {commit}; deadline {s.deadline_s} s; "
                 f"NCCL_DEBUG={env.get('NCCL_DEBUG')}")
        self.write_results()
        for name in self.stages:
            if self.stopping:
                break
            why = plan.skip_reason(name, self.status, s.device, bool(s.ctests), s.deadline_s, self.elapsed())
            if why:
                self.status[name], self.note[name] = "skipped", why
                self.say(f"stage {name} skipped: {why}")
                continue
            self.run_stage(name, env_error)
        self.finish()
        return 0 if all(v == "pass" for v in self.status.values()) else 1

    def run_stage(self, name, env_error):
        s, ctx = self.s, self.ctx
        limit = self.limit[name] = plan.limit_of(name, self.stages, self.status, s.deadline_s, self.elapsed(),
                                                 s.limits)
        if name != "report" and os.path.exists(ctx.path(f"{name}.jsonl")):
            os.remove(ctx.path(f"{name}.jsonl"))
        self.say(f"stage {name} (at most {limit} s)")
        self.status[name], self.current, self.current_t0 = "running", name, time.monotonic()
        self.write_results()
        st = StageRun(ctx, name, limit)
        ctx.runner.deadline = st.deadline
        status, note = "fail", None
        try:
            if env_error:
                note = env_error
                self.say(env_error)
            else:
                status = "pass" if STAGE_FUNCTIONS[name](ctx, st) else "fail"
        except Stopped:
            pass
        except StageTimedOut:
            status = "timeout"
            note = (f"stopped after its own limit, {limit} s" if limit >= s.limits.get(name, plan.BY_NAME[name].limit_s)
                    else f"stopped after {limit} s: what the deadline ({s.deadline_s} s) left it")
        except Exception as e:  # a fault of this program: the stage fails, saying where
            note = f"gpu_check failed: {type(e).__name__}: {e}"
            with open(self.log, "a") as f:
                f.write(traceback.format_exc())
        ctx.runner.deadline = None
        self.current = None
        if self.stopping:  # the signal handler set the status
            self.seconds[name] = round(time.monotonic() - self.current_t0)
        else:
            self.status[name], self.seconds[name] = status, round(time.monotonic() - self.current_t0)
            self.note[name] = "; ".join(x for x in [note] + st.notes if x)
            self.say(f"stage {name} {status} in {self.seconds[name]} s")
        if status != "pass" or self.stopping:
            end_leftovers([s.state] + ([s.build + os.sep] if s.device == "CUDA" else []), self.say)
        self.write_results()

    def _on_signal(self, signum, frame):
        """The call was told to stop (the command's limit, Ctrl-C): hand back
        what there is at once, then end the stage in flight (its processes
        first; the stage then raises Stopped) and exit."""
        if self.stopping:
            return
        self.stopping = True
        name = signal.Signals(signum).name
        if self.current:
            self.status[self.current] = "interrupted"
            self.seconds[self.current] = round(time.monotonic() - self.current_t0)
            self.note[self.current] = f"stopped by {name}"
        for stage, status in self.status.items():
            if status == "pending":
                self.status[stage], self.note[stage] = "skipped", "the call was stopped first"
        self.say(f"stopped by {name}")
        self.write_results()
        if self.ctx:
            self.ctx.runner.stop()

    def finish(self):
        """The summary, the tarball and the table, printed last."""
        if self.current:
            self.status[self.current], self.note[self.current] = "interrupted", "the call ended while it ran"
        self.write_results(final=True)
        print(f"gpu_check: results in {self.s.out}: {self.tarball}, {SUMMARY}", flush=True)

    def write_results(self, final=False):
        """The summary and the tarball of this call, in $OUT (the summary in
        the tarball too). Cheap; done after every stage. Not re-entered: a
        signal that arrives during a write leaves it to the write after."""
        if self.writing:
            return
        self.writing = True
        s = self.s
        try:
            rows = [(n, self.status[n], self.seconds.get(n, 0), self.note.get(n, ""), self.limit.get(n))
                    for n in self.stages]
            with open(os.path.join(s.state, "call.tsv"), "w") as f:
                f.writelines("\t".join(str(x).replace("\t", " ") for x in r) + "\n" for r in rows)
            ctx = self.ctx
            summary = report.call_summary(
                s.state, rows, ctx.commit if ctx else envmod.git_commit(s.root, self.environ), s.device,
                getattr(self, "machine", {}), ctx.libraries if ctx else {}, self.tarball, self.elapsed(),
                s.deadline_s, final)
            report.write_json(os.path.join(s.state, "machine.json"), summary["machine"])
            report.write_json(os.path.join(s.state, SUMMARY), summary)
        except Exception as e:  # still hand back what says so
            summary = {"stages_asked": self.stages, "result": "fail", "final": final,
                       "why": f"the summary could not be written: {type(e).__name__}: {e}"}
            report.write_json(os.path.join(s.state, SUMMARY), summary)
        try:
            report.pack(s.state, self.since, os.path.join(s.out, self.tarball))
            shutil.copyfile(os.path.join(s.state, SUMMARY), os.path.join(s.out, SUMMARY))
        finally:
            self.writing = False
        if final and "stages" in summary:
            report.print_summary(summary)

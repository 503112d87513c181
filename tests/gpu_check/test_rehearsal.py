"""scripts/gpu_check rehearsed on the CPU (MP_GPU_CHECK_DEVICE=CPU: CPU
against CPU, so it proves the program, not a GPU), against the build that
MP_GPU_BUILD names. Each call below runs once, all at once (the `calls`
fixture), and the cases read what it handed back: the summary, the
tarball's listing, the rows.

  passing     smoke agree report: every stage passes
  gpt2        gemm gpt2 report on a tiny GPT at B = 4 and 16
  hung        tests smoke agree update report: a stand-in GPU CTest that
              hangs (TIMEOUT 600) in a tests stage of 6 s, and a smoke run
              that hangs at step 3 (MP_FAULT) in a stage of 3 s
  stopped     gpt2 report, stopped by SIGTERM as PyTorch's run starts
"""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time

import pytest
from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "gpu_check")
SUMMARY = "gpu_check_summary.json"
TINY_GPT = ("--set model.gpt.vocab=256 --set model.gpt.context=32 --set model.gpt.channels=32 "
            "--set model.gpt.heads=2 --set model.gpt.layers=1")
GPT2 = {"MP_GPU_CHECK_GPT2_STEPS": "8", "MP_GPU_CHECK_GPT2_ARGS": TINY_GPT}
HANGING_CTESTS = """add_test(quick_passes "/bin/true")
set_tests_properties(quick_passes PROPERTIES LABELS "gpu" TIMEOUT 600)
add_test(hangs "/bin/sleep" "1000")
set_tests_properties(hangs PROPERTIES LABELS "gpu" TIMEOUT 600)
"""
CALLS = {
    "passing": (["smoke", "agree", "report"], {}),
    "gpt2": (["gemm", "gpt2", "report"], dict(GPT2, MP_GPU_CHECK_DEADLINE_S="300", MP_GPU_CHECK_COMPILE_S="100000")),
    "hung": (["tests", "smoke", "agree", "update", "report"], {"MP_GPU_CHECK_STAGE_S": "tests=6 smoke=3",
                                                               "MP_FAULT": "hang@3:0"}),
    "stopped": (["gpt2", "report"], dict(GPT2, MP_GPU_CHECK_TORCH_ARGS="--device cpu --threads 1 --steps 100000")),
}


class Call:
    """One call of scripts/gpu_check in a folder of its own, started at once."""

    def __init__(self, base, name, stages, extra):
        self.dir = os.path.join(base, name)
        self.out, self.state = os.path.join(self.dir, "out"), os.path.join(self.dir, "state")
        os.makedirs(self.out)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MP_GPU_CHECK_") and k != "MP_NUM_THREADS"}
        env.update({"MP_GPU_CHECK_DEVICE": "CPU", "MP_GPU_CHECK_STEPS": "16", "MP_GPU_CHECK_PYTHON": sys.executable,
                    "OUT": self.out, "MP_GPU_CHECK_STATE": self.state}, **extra)
        if name == "hung":
            os.makedirs(os.path.join(self.dir, "ctests"))
            with open(os.path.join(self.dir, "ctests", "CTestTestfile.cmake"), "w") as f:
                f.write(HANGING_CTESTS)
            env["MP_GPU_CHECK_CTESTS"] = os.path.join(self.dir, "ctests")
        self.log = open(os.path.join(self.dir, "output.log"), "w")
        self.t0 = time.monotonic()
        self.p = subprocess.Popen([SCRIPT] + stages, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.rc = None

    def finish(self):
        if self.rc is None:
            self.rc = self.p.wait(timeout=240)
            self.seconds = time.monotonic() - self.t0
            self.log.close()
            with open(os.path.join(self.dir, "output.log")) as f:
                sys.stdout.write(f.read())  # shown when a case fails
            with open(os.path.join(self.out, SUMMARY)) as f:
                self.summary = json.load(f)
            with tarfile.open(os.path.join(self.out, self.summary["tarball"])) as tar:
                self.listing = tar.getnames()
        return self

    def stage(self, name):
        return self.summary["stages"][name]

    def rows(self, stage):
        return {r["case"]: r for r in self.stage(stage).get("rows", [])}


@pytest.fixture(scope="session")
def calls(tmp_path_factory):
    """calls(name): the finished call of that name."""
    assert os.path.exists(os.path.join(os.environ["MP_GPU_BUILD"], "mp_worker")), "MP_GPU_BUILD: a build with mp_worker"
    # The stopped call is stopped during PyTorch's run, which then lasts.
    assert importlib.util.find_spec("torch"), f"{sys.executable} has no torch (scripts/python_env)"
    base = str(tmp_path_factory.mktemp("rehearsal"))
    started = {name: Call(base, name, *CALLS[name]) for name in CALLS}
    stopper = threading.Thread(target=stop_when_it_logs, args=(started["stopped"], "torch_gpt2"), daemon=True)
    stopper.start()
    yield lambda name: started[name].finish()
    for call in started.values():
        if call.p.poll() is None:
            call.p.kill()


def stop_when_it_logs(call, name):
    """SIGTERM to the call as soon as logs/NAME.log appears."""
    log = os.path.join(call.state, "logs", f"{name}.log")
    for _ in range(2400):
        if os.path.exists(log) or call.p.poll() is not None:
            break
        time.sleep(0.05)
    call.p.send_signal(signal.SIGTERM)


def call_processes(state):
    """Processes whose environment names this call's results folder (its workers and their children)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"MP_GPU_CHECK_STATE={state}".encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return [p for p in found if p != os.getpid()]


# ---- what every call hands back ---------------------------------------------------------

@pytest.mark.parametrize("name", list(CALLS))
def test_a_call_hands_back_its_tarball_and_summary_and_nothing_else(calls, name):
    call = calls(name)
    found = [os.path.relpath(os.path.join(top, f), call.out) for top, _, files in os.walk(call.out) for f in files]
    assert sorted(found) == sorted([call.summary["tarball"], SUMMARY])  # at most 8 files, 2 folders down
    assert call.summary["final"] is True and SUMMARY in call.listing and "logs/gpu_check.log" in call.listing


def test_a_passing_call_exits_0_and_its_summary_says_pass(calls):
    call = calls("passing")
    assert call.rc == 0 and call.summary["result"] == "pass"
    assert [call.stage(s)["status"] for s in ("smoke", "agree", "report")] == ["pass"] * 3
    assert set(call.rows("agree")) == {"agree_RECIPE_FP32", "agree_BF16_MASTER", "gpu_checkpoint_verify_export_resume"}
    for f in ("logs/smoke.log", "logs/resume.log", "agree_BF16_MASTER/gpu/metrics.jsonl", "resumed/metrics.jsonl"):
        assert f in call.listing


def test_rank_launches_are_unbound_so_a_worker_uses_every_core_it_is_allowed(calls):
    # Open MPI binds a rank of a 1- or 2-rank launch to one core unless told
    # --bind-to none; the worker sizes its threads by the cores it may use.
    assert calls("passing").rows("smoke")["smoke_cuda_sync"]["threads"] == len(os.sched_getaffinity(0))
    assert {r["threads"] for r in calls("gpt2").stage("gpt2")["rows"] if "batch" in r} == {
        len(os.sched_getaffinity(0))}


def test_a_call_records_where_its_cudnn_comes_from(calls):
    assert calls("passing").summary["libraries"]["cudnn"]["from"]


# ---- gemm and gpt2 -------------------------------------------------------------------------

def test_gemm_is_skipped_without_a_device_saying_so(calls):
    gemm = calls("gpt2").stage("gemm")
    assert gemm["status"] == "skipped" and "needs a CUDA device" in gemm["note"]


def test_gpt2_passes_as_a_stage_while_its_rows_miss_their_targets(calls):
    call = calls("gpt2")
    assert call.rc == 1 and call.summary["result"] == "fail"
    assert (call.stage("gpt2")["status"], call.stage("report")["status"]) == ("pass", "fail")


@pytest.mark.parametrize("batch", [4, 16])
def test_gpt2_rows_carry_the_ops_per_step_of_the_workers_log(calls, batch):
    call = calls("gpt2")
    row = call.rows("gpt2")[f"gpt2_124m_b{batch}"]
    with open(os.path.join(call.state, "logs", f"gpt2_b{batch}.log")) as f:
        ops = [int(line.split()[5]) for line in f if line.startswith("ops per step (rank 0): ")][0]
    assert (row["batch"], row["ops_per_step"], row["pass"]) == (batch, ops, False) and row["tokens_per_s"] > 0


def test_gpt2_at_b4_misses_only_its_eager_ratio_without_pytorch_on_a_gpu(calls):
    assert calls("gpt2").rows("gpt2")["gpt2_124m_b4"]["missed"] == ["ratio_to_torch_amp_bf16 not measured"]


def test_torch_compile_that_does_not_fit_is_skipped_by_name_largest_batch_first(calls):
    note = calls("gpt2").stage("gpt2")["note"]
    assert note.index("torch amp_bf16_compile at B=16 skipped") < note.index("torch amp_bf16_compile at B=4 skipped")


def test_gpt2_is_limited_by_the_deadline_less_handing_back_and_reports_time(calls):
    # 300 s less 20 for handing back and 5 for report, less what gpt2 started after
    assert 250 <= calls("gpt2").stage("gpt2")["limit_s"] <= 275


def test_gpt2_tarball_has_every_runs_log_and_rows(calls):
    listing = calls("gpt2").listing
    for f in ("logs/gpt2_b4.log", "logs/gpt2_b16.log", "logs/gpt2_profile.log", "logs/torch_gpt2.log",
              "gpt2.jsonl", "torch_gpt2.jsonl", "gpt2_b16/metrics.jsonl", "call.tsv"):
        assert f in listing


# ---- stages cut short, a failed smoke, a stop ----------------------------------------------

def test_a_hung_gpu_test_is_ended_before_its_stage_and_its_rows_come_back(calls):
    call = calls("hung")
    tests = call.stage("tests")
    assert tests["status"] == "fail" and tests["seconds"] < tests["limit_s"] == 6 and "hangs" in tests["note"]
    rows = call.rows("tests")
    assert rows["ctest_quick_passes"]["pass"] and rows["ctest_hangs"]["result"] == "Timeout"
    assert rows["ctest_gpu"] == {"case": "ctest_gpu", "pass": False, "tests": 2, "skipped": 0, "timed_out": 1}


def test_a_hung_stage_is_cut_at_its_limit_and_the_call_goes_on(calls):
    call = calls("hung")
    smoke = call.stage("smoke")
    assert smoke["status"] == "timeout" and smoke["note"] == "stopped after its own limit, 3 s"
    assert call.stage("report")["status"] == "fail" and not call_processes(call.state)


def test_a_failed_smoke_skips_agree_but_not_update(calls):
    call = calls("hung")
    assert call.stage("agree")["status"] == "skipped" and "smoke run failed" in call.stage("agree")["note"]
    assert call.stage("update")["status"] == "pass" and "adamw_fp32master_bf16grad_64K_1t" in call.rows("update")


def test_a_call_stopped_by_sigterm_hands_back_what_it_measured_and_leaves_nothing_running(calls):
    call = calls("stopped")
    assert call.rc != 0 and call.summary["result"] == "fail"  # the rows so far miss their targets
    assert (call.stage("gpt2")["status"], call.stage("report")["status"]) == ("interrupted", "skipped")
    assert call.stage("gpt2")["note"] == "stopped by SIGTERM"
    assert {"gpt2_124m_b4", "gpt2_124m_b16"} <= set(call.rows("gpt2"))  # written before PyTorch's run
    assert not call_processes(call.state)


# ---- the stages' environment ------------------------------------------------------------

def test_cudnn_from_pytorchs_wheel_loads_with_its_nvrtc(tmp_path):
    # MP_GPU_CHECK_CUDNN=wheel: as on a machine whose toolkit has no cuDNN.
    code = ("import ctypes, glob, os\n"
            "def load(name):  # by soname, as the worker loads them\n"
            "    return [ctypes.CDLL(os.path.basename(p)) for d in os.environ['LD_LIBRARY_PATH'].split(':')\n"
            "            for p in glob.glob(f'{d}/{name}.so.*')][:1]\n"
            "cudnn, nvrtc = load('libcudnn'), load('libnvrtc')\n"
            "print(cudnn[0].cudnnGetVersion(), len(nvrtc))\n"
            "print('\\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libcudnn.so' in l\n"
            "                         or 'libnvrtc.so' in l})))\n")
    env = dict(os.environ, MP_GPU_CHECK_DEVICE="CPU", MP_GPU_CHECK_CUDNN="wheel", MP_GPU_CHECK_PYTHON=sys.executable,
               MP_GPU_CHECK_STATE=str(tmp_path))
    out = subprocess.run([SCRIPT, "--env", sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    version, nvrtc = map(int, out[0].split())
    loaded = [line for line in out[1:] if line]
    assert version >= 90000 and nvrtc == 1
    assert all("/nvidia/" in os.path.realpath(p) for p in loaded) and len(loaded) == 2, loaded

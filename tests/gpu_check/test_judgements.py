"""The judgements and rules of scripts/gpu_check on made-up data, so that
they are known to pass and fail as documented before a GPU runs them:
loss agreement, GPT-2's speed row and targets, the worker's log lines,
mp_bench's and ctest's rows, the memcheck verdict, the stage plan
(skips, limits), a call's summary, the table, the merge, the report and
the sources' mtimes kept for a build folder used again."""
import contextlib
import io
import json
import os
import re
import time

import pytest
from conftest import ROOT, worker_log

from gpucheck import build_stages, cli, judge, plan, report
from gpucheck import env as envmod
from gpucheck.context import Context, StageRun
from gpucheck.proc import Runner

CPU_LOSSES = [5.0, 4.0, 3.0, 2.5]


# ---- loss agreement -------------------------------------------------------------------

@pytest.mark.parametrize("losses, recipe, passes", [
    (CPU_LOSSES, "RECIPE_FP32", True),
    ([5.0, 4.0 * (1 + 1e-3), 3.0, 2.5], "RECIPE_FP32", True),   # within 2e-3 at every step
    ([5.0, 4.0, 3.0, 2.56], "RECIPE_FP32", False),               # 2.4e-2 off at the last step
    ([5.0, float("nan"), 3.0, 2.5], "RECIPE_FP32", False),
    ([5.2, 4.3, 3.1, 2.54], "BF16_MASTER", True),                # final within 0.05 nats
    ([5.0, 4.0, 3.0, 2.56], "BF16_MASTER", False),               # final 0.06 away
])
def test_agree_judges_each_recipe_by_its_tolerance(run_dir, losses, recipe, passes):
    assert judge.agree(run_dir("gpu", losses), run_dir("cpu", CPU_LOSSES), recipe)["pass"] is passes


def test_agree_names_the_worst_step(run_dir):
    row = judge.agree(run_dir("gpu", [5.0, 4.0, 3.03, 2.5]), run_dir("cpu", CPU_LOSSES), "RECIPE_FP32")
    assert row["worst_step"] == 3 and row["pass"] is False


def test_a_resumed_run_agrees_only_with_equal_losses_after_its_checkpoint(run_dir):
    first = run_dir("first", CPU_LOSSES)
    assert judge.resumed_equal(first, run_dir("same", [9.0, 9.0, 3.0, 2.5]), 2)
    assert not judge.resumed_equal(first, run_dir("other", [5.0, 4.0, 3.0, 2.4]), 2)
    assert not judge.resumed_equal(first, str(first) + "_missing", 2)


# ---- the worker's log and GPT-2's speed -----------------------------------------------

def test_step_ops_reads_the_first_ops_line_and_counts_gemm_plans_by_form():
    ops = judge.step_ops(worker_log(280))
    assert (ops["ops_per_step"], ops["ops_model"], ops["ops_engine"]) == (280, 240, 40)
    assert ops["gemm_plans"] == 3 and ops["gemm_plan_forms"] == {
        "fused in cuBLASLt's epilogue": 2, "packed to fp32 (A, B), product, then kernels": 1}
    assert judge.step_ops("step 1\n  gemm plan: x: y, algorithm 1 of 2\n") == {}


def test_worker_facts_give_threads_device_and_the_attention_path():
    facts = judge.worker_facts(worker_log(280))
    assert facts == {"threads": 16, "device": "cuda:0 (NVIDIA H100), data plane NCCL",
                     "attention": "cuDNN fused attention (bf16 q, k, v, fp32 statistics)"}


def test_worker_facts_keep_why_the_flash_kernels_ran_and_which_cudnn_was_loaded():
    line = ("model: GPT; CUDA kernels, attention: the fp32 flash kernels on fp32 copies of the bf16 q, k, v: "
            "cannot load cuDNN (libcudnn.so.9); loss in chunks of 64 rows")
    facts = judge.worker_facts(line + "\ncudnn (rank 0): cuDNN 92600 at /w/nvidia/cudnn/lib/libcudnn.so.9\n")
    assert facts["attention"].startswith("the fp32 flash kernels") and "cannot load cuDNN" in facts["attention"]
    assert facts["cudnn"] == "cuDNN 92600 at /w/nvidia/cudnn/lib/libcudnn.so.9"


TORCH = [{"case": "gpt2_124m_amp_bf16", "value": 100000.0, "batch": 4},
         {"case": "gpt2_124m_amp_bf16", "value": 160000.0, "batch": 16},
         {"case": "gpt2_124m_amp_bf16_compile", "error": "boom", "batch": 4}]


def test_speed_row_has_median_tokens_mfu_and_ratios_at_its_batch(run_dir):
    s = judge.speed(run_dir("fast", [5.0] * 10, 200000.0, 7.0e8), 989.0, TORCH, 5, batch=4)
    # steps 6..10: tokens/s 200005 .. 200009, median 200007
    assert s["tokens_per_s"] == 200007.0 and s["flops_per_token"] == 7.0e8
    assert s["mfu"] == round(200007.0 * 7e8 / 989e12, 4)
    assert s["ratio_to_torch_amp_bf16"] == round(200007.0 / 100000.0, 3)
    assert s["torch_amp_bf16_compile_error"] == "boom"
    assert s["missed"] == ["ops_per_step not measured"]


@pytest.mark.parametrize("tokens, batch, ops, torch_rows, missed", [
    (200000.0, 4, 280, TORCH, []),                                            # 2x eager: passes; MFU not B=4's target
    (200000.0, 4, 301, TORCH, ["ops_per_step 301 (target <= 300)"]),
    (120000.0, 4, 280, TORCH, ["ratio_to_torch_amp_bf16 1.2 (target >= 1.3)"]),
    (200000.0, 4, 280, [], ["ratio_to_torch_amp_bf16 not measured"]),          # its target is that ratio
    (600000.0, 16, 280, TORCH, []),                                           # MFU 0.4247, no compile row
    (600000.0, 16, 280, TORCH + [{"case": "gpt2_124m_amp_bf16_compile", "value": 620000.0, "batch": 16}],
     [f"ratio_to_torch_amp_bf16_compile {round(600007.0 / 620000.0, 3)} (target >= 1.0)"]),
    (200000.0, 16, 280, TORCH, ["mfu 0.1416 (target >= 0.4)"]),
])
def test_speed_targets_by_batch(run_dir, tokens, batch, ops, torch_rows, missed):
    s = judge.speed(run_dir("run", [5.0] * 10, tokens, 7.0e8), 989.0, torch_rows, 5, batch=batch,
                    log_text=worker_log(ops))
    assert s.get("missed", []) == missed and s["pass"] is (not missed)


def test_speed_row_keys_its_table_columns_first_and_carries_how_the_worker_ran(run_dir):
    s = judge.speed(run_dir("run", [5.0] * 10, 200000.0), 989.0, TORCH, 5, batch=16, log_text=worker_log(280))
    assert list(s)[:5] == ["case", "batch", "tokens_per_s", "mfu", "ops_per_step"]
    assert s["threads"] == 16 and s["attention"].startswith("cuDNN fused attention")


def test_speed_without_judging_has_no_verdict_and_without_metrics_fails(run_dir, tmp_path):
    s = judge.speed(run_dir("run", [5.0] * 10), 989.0, TORCH, 5, batch=4, log_text=worker_log(999), judge=False)
    assert "pass" not in s and "missed" not in s
    s = judge.speed(str(tmp_path / "none"), 989.0, TORCH, 5, batch=4)
    assert s["pass"] is False and "no metrics" in s["why"]


def test_put_row_replaces_the_row_of_its_case(tmp_path):
    path = str(tmp_path / "gpt2.jsonl")
    for row in ({"case": "b4", "v": 1}, {"case": "b16", "v": 2}, {"case": "b4", "v": 3}):
        report.put_row(path, row)
    assert report.read_rows(path) == [{"case": "b16", "v": 2}, {"case": "b4", "v": 3}]


def test_smoke_needs_every_step_and_finite_losses(run_dir, tmp_path):
    log = "device (rank 0): cuda:0 (NVIDIA H100), data plane NCCL\n"
    good = run_dir("smoke", [5.5, 5.4, 5.3])
    row = judge.smoke(good, log, 3)
    assert row["pass"] and row["final_loss"] == 5.3 and row["device"].startswith("cuda:0")
    assert not judge.smoke(good, log, 4)["pass"]
    assert not judge.smoke(run_dir("nan", [5.5, float("nan")]), log, 2)["pass"]
    assert not judge.smoke(str(tmp_path / "none"), log, 3)["pass"]


# ---- mp_bench, ctest, compute-sanitizer -----------------------------------------------

def test_gemm_rows_put_the_table_keys_first_and_fail_an_error():
    lines = ["# a note",
             json.dumps({"suite": "gemm_cuda", "case": "peak_8192_bf16", "value": 760.0, "unit": "TFLOP/s"}),
             json.dumps({"suite": "gemm_cuda", "case": "c_attn_fwd_b4", "value": 500.0, "ratio": 0.658, "ms": 0.03,
                         "speedup_over_plain": 1.1, "plan": {"form": "fused (bias)", "algorithm": 21}}),
             json.dumps({"suite": "gemm_cuda", "case": "logits_b4", "error": "cuBLASLt has no algorithm"})]
    rows = [r for r in map(judge.gemm_row, lines) if r]
    assert list(rows[1])[:6] == ["case", "value", "ratio", "speedup_over_plain", "ms", "form"]
    assert "pass" not in rows[0] and "pass" not in rows[1] and rows[2]["pass"] is False


def test_a_suite_without_rows_or_cut_short_is_one_failed_row_saying_why():
    said = "[rank 0] mp_bench: the gemm_cuda suite needs a CUDA device: no CUDA device\n"
    row = judge.bench_failure("gemm_cuda", said, 2, [])
    assert row["pass"] is False and "needs a CUDA device" in row["why"]
    row = judge.bench_failure("gemm_cuda", "Segmentation fault\n", 139, [{"case": "peak_8192_bf16"}])
    assert row["exit"] == 139
    assert judge.bench_failure("update_cuda", "", 0, [{"case": "adamw"}]) is None


def test_ctest_rows_from_its_result_lines():
    lines = ["1/4 Test #61: gpu_core .........................   Passed   12.34 sec",
             "2/4 Test #62: gpu_nccl .........................***Failed    1.00 sec",
             "3/4 Test #63: gpu_staged_np2 ...................***Skipped   0.50 sec",
             "4/4 Test #64: gpu_engine_np1 ...................***Timeout 600.02 sec",
             "61: [  PASSED  ] 40 tests."]
    rows = [r for r in map(judge.ctest_row, lines) if r]
    assert [(r["case"], r["pass"], r["result"], r["seconds"]) for r in rows] == [
        ("ctest_gpu_core", True, "Passed", 12.34), ("ctest_gpu_nccl", False, "Failed", 1.0),
        ("ctest_gpu_staged_np2", False, "Skipped", 0.5), ("ctest_gpu_engine_np1", False, "Timeout", 600.02)]


def test_the_sanitizer_goes_in_front_of_the_test_binary_also_under_mprun(tmp_path):
    binary = tmp_path / "build" / "tests" / "mp_gpu_tests"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    build, b, cs = str(tmp_path / "build"), str(binary), ["compute-sanitizer", "--tool", "memcheck"]
    assert judge.sanitized_command([b, "--x"], build, cs) == cs + [b, "--x"]
    mprun = ["/src/launch/mprun", "-np", "2", "--bind-to", "none"]
    assert judge.sanitized_command(mprun + [b], build, cs) == mprun + cs + [b]
    assert judge.sanitized_command(["/bin/true"], build, cs) is None


@pytest.mark.parametrize("log, rc, skip, passes, why", [
    ("[  PASSED  ] 3 tests.\n========= ERROR SUMMARY: 0 errors\n", 0, ["no CUDA device: "], True, ""),
    ("========= Invalid __global__ write of size 4 bytes\n========= ERROR SUMMARY: 2 errors\n", 97, [], False,
     "2 memcheck error(s)"),
    ("no CUDA device: none\n========= ERROR SUMMARY: 0 errors\n", 0, ["no CUDA device: "], False,
     "skipped: the device was not usable"),
    ("Segmentation fault\n", 139, [], False, "no ERROR SUMMARY: the sanitizer did not finish"),
    ("========= Error: Device not supported\n========= ERROR SUMMARY: 0 errors\n", 255, [], False,
     "compute-sanitizer refused this device"),
])
def test_sanitizer_verdict(log, rc, skip, passes, why):
    ok, _, said = judge.sanitizer_verdict(log, rc, skip)
    assert ok is passes and said.startswith(why)


def test_memcheck_runs_its_jobs_at_once_and_writes_a_row_per_test(tmp_path):
    sanitizer = tmp_path / "fake-sanitizer"  # runs the test (after --tool memcheck --error-exitcode 97)
    sanitizer.write_text('#!/bin/sh\nshift 4\n"$@"\nrc=$?\necho "========= ERROR SUMMARY: 0 errors"\nexit $rc\n')
    test = tmp_path / "build" / "tests" / "mp_slow_test"
    test.parent.mkdir(parents=True)
    test.write_text('#!/bin/sh\nsleep 1\n[ "$1" != fail ]\n')
    for f in (sanitizer, test):
        f.chmod(0o755)
    tests = [{"name": f"t{i}", "command": [str(test)] + (["fail"] if i == 3 else []), "cwd": str(tmp_path),
              "env": [], "skip": []} for i in range(4)]
    settings = envmod.Settings(ROOT, {"MP_GPU_BUILD": str(tmp_path / "build"), "MP_GPU_CHECK_STATE": str(tmp_path),
                                      "MP_GPU_CHECK_MEMCHECK_JOBS": "4"})
    os.makedirs(settings.logs)
    ctx = Context(settings, ["memcheck"], "abc", dict(os.environ), [], {},
                  Runner(ROOT, settings.logs, dict(os.environ), lambda text, echo=True: None),
                  os.path.join(settings.logs, "gpu_check.log"))
    t0 = time.monotonic()
    ok = build_stages.memcheck(ctx, StageRun(ctx, "memcheck", 60), lambda d: tests, lambda: str(sanitizer))
    took = time.monotonic() - t0
    rows = {r["case"]: r for r in report.read_rows(str(tmp_path / "memcheck.jsonl"))}
    assert [rows[f"memcheck_t{i}"]["pass"] for i in range(4)] == [True, True, True, False] and not ok
    assert rows["memcheck_t3"]["why"] == "exit 1"
    assert took < 3.0, f"4 tests of 1 s at once took {took:.1f} s"


# ---- the stage plan -------------------------------------------------------------------

def test_docs_name_the_first_commands_tarball():
    with open(os.path.join(ROOT, "docs", "gpu.md")) as f:
        assert plan.tarball_name(plan.FIRST_COMMAND) in f.read()


def test_a_failed_smoke_skips_only_the_stages_that_train_on_the_device():
    status = {"build": "pass", "smoke": "fail"}
    skipped = {s for s in plan.ALL_STAGES if plan.skip_reason(s, status, "CUDA", False, 0, 0)}
    assert skipped == {"agree", "faults", "gpt2"}


def test_a_failed_build_skips_all_but_report():
    skipped = {s for s in plan.ALL_STAGES if plan.skip_reason(s, {"build": "fail"}, "CUDA", False, 0, 0)}
    assert skipped == set(plan.ALL_STAGES) - {"report"}


def test_a_rehearsal_skips_the_device_stages_but_tests_on_a_ctest_folder():
    def skipped(ctests):
        return {s for s in plan.ALL_STAGES if plan.skip_reason(s, {}, "CPU", ctests, 0, 0)}
    assert skipped(False) == {"tests", "memcheck", "gemm"} and skipped(True) == {"memcheck", "gemm"}


def test_limits_leave_the_later_stages_their_expected_time():
    stages = plan.FIRST_COMMAND
    status = {s: "pending" for s in stages}
    # tests at 100 s: 540 - 100 - 20 less smoke agree gemm update gpt2's 135 s: 285 s, under its own 300
    assert plan.limit_of("tests", stages, status, 540, 100) == 285
    assert plan.limit_of("tests", stages, status, 0, 100) == 300          # no deadline: its own
    assert plan.limit_of("gpt2", stages, status, 540, 500) == 20          # all there is left
    assert plan.limit_of("tests", stages, status, 540, 100, {"tests": 60}) == 60
    assert plan.skip_reason("gpt2", status, "CUDA", False, 540, 495) == \
        "no time left before the call's deadline (540 s)"


def test_own_limits_are_stage_equals_seconds():
    assert plan.own_limits("tests=120 gpt2=300") == {"tests": 120, "gpt2": 300}
    for bad in ("test=1", "tests=", "tests=0", "tests"):
        with pytest.raises(ValueError):
            plan.own_limits(bad)


def test_the_build_compiles_what_the_calls_stages_run():
    assert build_stages.targets_for(["build", "smoke", "update"], False) == ["mp_worker", "mp_bench"]
    assert build_stages.targets_for(["build"], True) == build_stages.GPU_TEST_TARGETS + ["_mp", "mp_worker", "mp_bench"]


# ---- a call's summary, the table, the report, the merge -----------------------------

def summary_of(state, stages):
    return report.call_summary(str(state), stages, "abc1234", "CPU", {}, {}, "x.tar.gz", 10, 480, True)


@pytest.fixture
def call_state(tmp_path):
    report.append_row(str(tmp_path / "tests.jsonl"), {"case": "ctest_gpu", "pass": True})
    report.append_row(str(tmp_path / "gpt2.jsonl"), {"case": "gpt2_124m_b16", "mfu": 0.2, "pass": False})
    return tmp_path


@pytest.mark.parametrize("stages, result", [
    ([("build", "pass", 90, "", None), ("tests", "pass", 60, "", None)], "pass"),
    ([("build", "pass", 90, "", None), ("tests", "timeout", 300, "stopped", None)], "incomplete"),
    ([("build", "pass", 9, "", None), ("tests", "skipped", 0, "no time", None)], "incomplete"),
    ([("build", "fail", 9, "exit 1", None), ("tests", "skipped", 0, "", None)], "fail"),
    ([("gpt2", "pass", 200, "", None)], "fail"),  # a row missed its target
])
def test_a_calls_result_follows_its_statuses_and_rows(call_state, stages, result):
    assert summary_of(call_state, stages)["result"] == result


def test_a_summary_has_the_rows_of_the_stages_that_ran(call_state):
    s = summary_of(call_state, [("build", "pass", 90, "", None), ("tests", "pass", 60, "", None),
                                ("gpt2", "skipped", 0, "", None)])
    assert s["stages"]["tests"]["rows"] == [{"case": "ctest_gpu", "pass": True}] and "rows" not in s["stages"]["gpt2"]
    assert s["stages_asked"] == ["build", "tests", "gpt2"] and s["commit"] == "abc1234"


def printed(fn, *args, **kwargs):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        value = fn(*args, **kwargs)
    return value, out.getvalue().splitlines()


def test_the_compact_table_prints_failures_and_counts_many_passes():
    rows = [{"case": f"ctest_t{i}", "pass": True} for i in range(9)] + [{"case": "ctest_bad", "pass": False}]
    failed, lines = printed(report.print_rows, "tests", rows, compact=True)
    assert failed == 1 and len(lines) == 2 and "FAIL tests" in lines[0] and "9 more rows" in lines[1]


def test_the_compact_table_keeps_the_headline_measurements():
    rows = [{"case": "peak_8192_bf16", "value": 1}] + [{"case": f"c{i}_b4", "value": i} for i in range(9)] + [
        {"case": "step_gemms_b4", "value": 2}]
    _, lines = printed(report.print_rows, "gemm", rows, compact=True)
    assert len(lines) == 3 and "peak_8192_bf16" in lines[0] and "step_gemms_b4" in lines[1]


def test_report_exits_1_when_a_row_failed(tmp_path):
    report.append_row(str(tmp_path / "agree.jsonl"), {"case": "agree_fp32", "pass": True})
    out = str(tmp_path / "out" / "gpu_check.json")
    assert printed(report.report, str(tmp_path), out, "abc")[0] == 0
    report.append_row(str(tmp_path / "update.jsonl"), {"case": "adamw", "pass": False})
    rc, lines = printed(report.report, str(tmp_path), out, "abc")
    assert rc == 1 and any("FAIL update" in line for line in lines)


def test_merge_keeps_the_last_run_of_a_stage_and_fails_on_a_stage_that_did_not_pass(call_state, tmp_path):
    paths = []
    for i, stages in enumerate([[("build", "pass", 90, "", None), ("tests", "fail", 60, "exit 1", None)],
                                [("build", "pass", 2, "", None), ("tests", "pass", 50, "", None)]]):
        paths.append(str(tmp_path / f"summary{i}.json"))
        report.write_json(paths[-1], summary_of(call_state, stages))
    merged = str(tmp_path / "merged.json")
    assert printed(cli.main, ["--merge", merged] + paths)[0] == 0
    m = json.load(open(merged))
    assert len(m["calls"]) == 2 and m["stages"]["tests"] == [{"case": "ctest_gpu", "pass": True}]
    rc, lines = printed(cli.main, ["--merge", merged, paths[1], paths[0]])
    assert rc == 1 and any("FAIL tests" in line for line in lines)


def test_a_tarball_over_15_mib_has_its_logs_cut_harder(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "big.log").write_bytes(os.urandom(3 << 20))  # does not compress
    monkeypatch.setattr(report, "TARBALL_MAX_BYTES", 2 << 20)
    report.pack(str(tmp_path), time.time() - 60, str(tmp_path / "x.tar.gz"))
    assert os.path.getsize(logs / "big.log") < (1 << 20) + 100
    assert re.search(rb"\[gpu_check: 3145728 bytes; the middle was cut\]", (logs / "big.log").read_bytes())


# ---- a build folder used again ---------------------------------------------------------

def test_unchanged_sources_get_their_mtimes_back_and_changed_ones_keep_theirs(tmp_path):
    tree = tmp_path / "tree"
    for name, text in (("kernels/a.cu", "a"), ("kernels/b.cc", "b"), ("build-gpu/x.o", "o")):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
        os.utime(tree / name, ns=(10**18, 10**18))
    stamp = str(tmp_path / "sources.stamp")
    assert envmod.save_mtimes(stamp, str(tree)) == 2  # the build folder left out
    for name in ("kernels/a.cu", "kernels/b.cc"):
        os.utime(tree / name, ns=(2 * 10**18, 2 * 10**18))
    (tree / "kernels/b.cc").write_text("changed")
    assert envmod.restore_mtimes(stamp, str(tree)) == 1
    assert os.stat(tree / "kernels/a.cu").st_mtime_ns == 10**18
    assert os.stat(tree / "kernels/b.cc").st_mtime_ns != 10**18
    assert envmod.restore_mtimes(str(tmp_path / "none"), str(tree)) == 0

#!/usr/bin/env python3
"""tests/check_gpu_check.py: the judgements of scripts/gpu_check.py on
made-up run directories, so they are known to pass and fail as documented
before a GPU ever runs them: loss agreement (fp32 per step, bf16 final
band, NaN), the speed row (tokens/s median, MFU, ratios to PyTorch, a
failed torch.compile), the targets per batch (B = 4: ops per step and the
ratio to eager; B = 16: MFU and the ratio to torch.compile where it ran),
the worker's ops line and GEMM plans, the rows of mp_bench gemm_cuda, the
smoke run, ctest's lines, the memcheck verdict and where the sanitizer goes
in a test's command, a call's summary (its result from the stages'
statuses and rows) and the table it prints, the merge of several calls'
summaries, the exit status of the report and the merge, and the sources'
mtimes put back for a build kept between calls."""
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gpu_check  # noqa: E402


def run_dir(base, name, losses, tokens_per_s=1000.0, flops_per_token=6e8):
    d = os.path.join(base, name)
    os.makedirs(d)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for i, loss in enumerate(losses):
            f.write(json.dumps({"step": i + 1, "loss": loss, "tokens_per_s": tokens_per_s + i,
                                "model_flops_per_s": (tokens_per_s + i) * flops_per_token}) + "\n")
    return d


def main():
    failures = []

    def check(what, cond):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as t:
        cpu = run_dir(t, "cpu", [5.0, 4.0, 3.0, 2.5])
        same = run_dir(t, "same", [5.0, 4.0, 3.0, 2.5])
        near = run_dir(t, "near", [5.0, 4.0 * (1 + 1e-3), 3.0, 2.5])
        off = run_dir(t, "off", [5.0, 4.0, 3.0 * 1.01, 2.5])
        nan = run_dir(t, "nan", [5.0, float("nan"), 3.0, 2.5])
        band = run_dir(t, "band", [5.2, 4.3, 3.1, 2.54])
        far = run_dir(t, "far", [5.0, 4.0, 3.0, 2.56])
        check("identical fp32 runs agree", gpu_check.agree(same, cpu, "RECIPE_FP32")["pass"])
        check("fp32 within 2e-3 agrees", gpu_check.agree(near, cpu, "RECIPE_FP32")["pass"])
        row = gpu_check.agree(off, cpu, "RECIPE_FP32")
        check("fp32 1% off at step 3 fails and names it", not row["pass"] and row["worst_step"] == 3)
        check("NaN fails", not gpu_check.agree(nan, cpu, "RECIPE_FP32")["pass"])
        check("bf16 final within 0.05 passes", gpu_check.agree(band, cpu, "BF16_MASTER")["pass"])
        check("bf16 final 0.06 away fails", not gpu_check.agree(far, cpu, "BF16_MASTER")["pass"])

        fast = run_dir(t, "fast", [5.0] * 10, tokens_per_s=200000.0, flops_per_token=7.0e8)
        torch_file = os.path.join(t, "torch.jsonl")
        with open(torch_file, "w") as f:
            f.write(json.dumps({"suite": "torch_gpt", "case": "gpt2_124m_amp_bf16", "value": 100000.0,
                                "batch": 4}) + "\n")
            f.write(json.dumps({"suite": "torch_gpt", "case": "gpt2_124m_amp_bf16", "value": 160000.0,
                                "batch": 16}) + "\n")
            f.write(json.dumps({"suite": "torch_gpt", "case": "gpt2_124m_amp_bf16_compile", "error": "boom",
                                "batch": 4}) + "\n")
        s = gpu_check.speed(fast, 989.0, torch_file, 5, batch=4)
        # steps 6..10: tokens/s 200005 .. 200009, median 200007
        check("speed median", s["tokens_per_s"] == 200007.0)
        check("flops per token from the metrics", s["flops_per_token"] == 7.0e8)
        check("mfu", abs(s["mfu"] - round(200007.0 * 7e8 / 989e12, 4)) < 1e-12)
        check("ratio to eager at its batch", s["ratio_to_torch_amp_bf16"] == round(200007.0 / 100000.0, 3))
        check("compile error kept", s["torch_amp_bf16_compile_error"] == "boom")
        check("no ops line: the op count target is missed", s["pass"] is False
              and s["missed"] == ["ops_per_step not measured"])

        # The worker's ops line and its GEMM plans (launch/run_log.cc).
        def worker_log(name, ops):
            path = os.path.join(t, name)
            with open(path, "w") as f:
                f.write("step 1 ...\n"
                        f"ops per step (rank 0): {ops} (model {ops - 40}, engine 40)\n"
                        "  gemm plan: 4096 x 2304 x 768, bf16 x bf16 -> bf16, bias: fused in cuBLASLt's epilogue, "
                        "algorithm 21 of 8, 512.5 TFLOP/s (cuda:0)\n"
                        "  gemm plan: 4096 x 3072 x 768, bf16 x bf16^T -> bf16, dgelu: packed to fp32 (A, B), "
                        "product, then kernels, algorithm 6 of 8, 401 TFLOP/s (cuda:0)\n"
                        "  gemm plan: 4096 x 768 x 768, bf16 x bf16 -> fp32, bias, addend: fused in cuBLASLt's "
                        "epilogue, algorithm 3 of 1, not timed (cuda:0)\n"
                        "step 3 ...\nops per step (rank 0): 999 (model 1, engine 998)\n")
            return path
        ops = gpu_check.step_ops(open(worker_log("ops.log", 280)).read())
        check("ops line parsed (the first one)", ops["ops_per_step"] == 280 and ops["ops_model"] == 240
              and ops["ops_engine"] == 40)
        check("gemm plans counted by form", ops["gemm_plans"] == 3 and ops["gemm_plan_forms"] ==
              {"fused in cuBLASLt's epilogue": 2, "packed to fp32 (A, B), product, then kernels": 1})
        check("no ops line: nothing", gpu_check.step_ops("step 1\n  gemm plan: x: y, algorithm 1 of 2\n") == {})

        # B = 4: ops <= 300 and >= 1.3x eager.
        s = gpu_check.speed(fast, 989.0, torch_file, 5, batch=4, log=worker_log("b4.log", 280))
        check("B=4 at 2x eager with 280 ops passes", s["pass"] is True and s["ops_per_step"] == 280
              and s["case"] == "gpt2_124m_b4" and "missed" not in s)
        check("B=4 mfu is not its target", s["mfu"] < 0.40 and s["pass"])
        s = gpu_check.speed(fast, 989.0, torch_file, 5, batch=4, log=worker_log("b4_many.log", 301))
        check("301 ops per step fail", s["pass"] is False and s["missed"] == ["ops_per_step 301 (target <= 300)"])
        slow = run_dir(t, "slow", [5.0] * 10, tokens_per_s=120000.0, flops_per_token=7.0e8)
        s = gpu_check.speed(slow, 989.0, torch_file, 5, batch=4, log=worker_log("b4_slow.log", 280))
        check("B=4 at 1.2x eager fails", s["pass"] is False and s["ratio_to_torch_amp_bf16"] == 1.2
              and s["missed"][0].startswith("ratio_to_torch_amp_bf16 1.2"))
        s = gpu_check.speed(fast, 989.0, os.path.join(t, "none.jsonl"), 5, batch=4, log=worker_log("b4n.log", 280))
        check("B=4 without an eager row fails: its target is that ratio", s["pass"] is False
              and s["missed"] == ["ratio_to_torch_amp_bf16 not measured"])

        # B = 16: MFU >= 0.40 and >= 1.0x torch.compile where it ran.
        big = run_dir(t, "big", [5.0] * 10, tokens_per_s=600000.0, flops_per_token=7.0e8)  # MFU 0.4247
        s = gpu_check.speed(big, 989.0, torch_file, 5, batch=16, log=worker_log("b16.log", 280))
        check("B=16 at MFU 0.42 passes without a compile row", s["pass"] is True and s["mfu"] == 0.4247
              and s["ratio_to_torch_amp_bf16"] == 3.75 and "ratio_to_torch_amp_bf16_compile" not in s)
        check("B=16 judged against its own batch's eager row", s["torch_amp_bf16_tokens_per_s"] == 160000.0)
        with open(torch_file, "a") as f:
            f.write(json.dumps({"suite": "torch_gpt", "case": "gpt2_124m_amp_bf16_compile", "value": 620000.0,
                                "batch": 16}) + "\n")
        s = gpu_check.speed(big, 989.0, torch_file, 5, batch=16, log=worker_log("b16c.log", 280))
        check("B=16 under torch.compile fails", s["pass"] is False and s["missed"] ==
              [f"ratio_to_torch_amp_bf16_compile {round(600007.0 / 620000.0, 3)} (target >= 1.0)"])
        s = gpu_check.speed(fast, 989.0, torch_file, 5, batch=16, log=worker_log("b16s.log", 280))
        check("B=16 at MFU 0.14 fails", s["pass"] is False and s["missed"][0].startswith("mfu 0.1416"))
        check("a row's table keys first", list(s)[:5] == ["case", "batch", "tokens_per_s", "mfu", "ops_per_step"])
        s = gpu_check.speed(fast, 989.0, torch_file, 5, batch=4, log=worker_log("b4j.log", 999), judge=False)
        check("not judged: no verdict", "pass" not in s and "missed" not in s)
        s = gpu_check.speed(os.path.join(t, "none"), 989.0, torch_file, 5, batch=4)
        check("a run without metrics fails, saying why", s["pass"] is False and "no metrics" in s["why"])
        rows_file = os.path.join(t, "gpt2.jsonl")
        gpu_check.put_row(rows_file, {"case": "gpt2_124m_b4", "v": 1})
        gpu_check.put_row(rows_file, {"case": "gpt2_124m_b16", "v": 2})
        gpu_check.put_row(rows_file, {"case": "gpt2_124m_b4", "v": 3})
        check("put_row replaces the row of its case", gpu_check.read_rows(rows_file) ==
              [{"case": "gpt2_124m_b16", "v": 2}, {"case": "gpt2_124m_b4", "v": 3}])

        # mp_bench gemm_cuda's rows.
        rows = gpu_check.gemm_rows("\n".join([
            "# a note",
            json.dumps({"suite": "gemm_cuda", "case": "peak_8192_bf16", "value": 760.0, "unit": "TFLOP/s"}),
            json.dumps({"suite": "gemm_cuda", "case": "c_attn_fwd_b4", "value": 500.0, "unit": "TFLOP/s",
                        "ref": "peak_8192_bf16", "ratio": 0.658, "ms": 0.03, "speedup_over_plain": 1.1,
                        "plan": {"form": "fused (bias)", "algorithm": 21}}),
            json.dumps({"suite": "gemm_cuda", "case": "logits_b4", "error": "cuBLASLt has no algorithm"})]), 1)
        check("gemm rows: the table's keys first", rows[1]["form"] == "fused (bias)" and
              list(rows[1])[:6] == ["case", "value", "ratio", "speedup_over_plain", "ms", "form"])
        check("gemm rows: measurements are not judged", "pass" not in rows[0] and "pass" not in rows[1])
        check("gemm rows: an error fails", rows[2]["pass"] is False and len(rows) == 3)
        rows = gpu_check.gemm_rows("[rank 0] mp_bench: the gemm_cuda suite needs a CUDA device: no CUDA device\n", 2)
        check("gemm without rows: one failed row saying why", len(rows) == 1 and rows[0]["pass"] is False
              and "needs a CUDA device" in rows[0]["why"])
        rows = gpu_check.gemm_rows(json.dumps({"case": "peak_8192_bf16", "value": 1.0}) + "\nSegmentation fault\n", 139)
        check("gemm cut short: a failed row", rows[-1]["pass"] is False and rows[-1]["exit"] == 139)

        state = os.path.join(t, "state")
        os.makedirs(state)
        with open(os.path.join(state, "agree.jsonl"), "w") as f:
            f.write(json.dumps({"case": "agree_fp32", "pass": True}) + "\n")
        out = os.path.join(t, "out", "gpu_check.json")
        ok = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py"), "report", state, out],
                            capture_output=True, text=True)
        check("report of passes exits 0", ok.returncode == 0 and json.load(open(out))["stages"]["agree"][0]["pass"])
        with open(os.path.join(state, "update.jsonl"), "w") as f:
            f.write(json.dumps({"case": "adamw", "pass": False}) + "\n")
        bad = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py"), "report", state, out],
                             capture_output=True, text=True)
        check("report with a failure exits 1", bad.returncode == 1 and "FAIL update" in bad.stdout)

        # The smoke run: every step logged and finite.
        smoke_dir = run_dir(t, "smoke", [5.5, 5.4, 5.3])
        log = os.path.join(t, "smoke.log")
        with open(log, "w") as f:
            f.write("model: ...\ndevice (rank 0): cuda:0 (NVIDIA H100), data plane NCCL\n")
        s = gpu_check.smoke(smoke_dir, log, 3)
        check("smoke passes", s["pass"] and s["final_loss"] == 5.3 and s["device"].startswith("cuda:0"))
        check("smoke with a step missing fails", not gpu_check.smoke(smoke_dir, log, 4)["pass"])
        check("smoke with NaN fails", not gpu_check.smoke(run_dir(t, "smoke_nan", [5.5, float("nan")]), log, 2)["pass"])
        check("smoke without a run fails", not gpu_check.smoke(os.path.join(t, "none"), log, 3)["pass"])

        # ctest's result lines.
        rows = gpu_check.ctest_rows("\n".join([
            "1/4 Test #61: gpu_core .........................   Passed   12.34 sec",
            "2/4 Test #62: gpu_nccl .........................***Failed    1.00 sec",
            "3/4 Test #63: gpu_staged_np2 ...................***Skipped   0.50 sec",
            "4/4 Test #64: gpu_engine_np1 ...................***Timeout 600.02 sec",
            "61: [  PASSED  ] 40 tests."]))
        check("ctest rows", [(r["case"], r["pass"], r["result"], r["seconds"]) for r in rows] == [
            ("ctest_gpu_core", True, "Passed", 12.34), ("ctest_gpu_nccl", False, "Failed", 1.0),
            ("ctest_gpu_staged_np2", False, "Skipped", 0.5), ("ctest_gpu_engine_np1", False, "Timeout", 600.02)])

        # memcheck: the sanitizer goes in front of the test binary, also under mprun.
        build = os.path.join(t, "build")
        os.makedirs(os.path.join(build, "tests"))
        binary = os.path.join(build, "tests", "mp_gpu_tests")
        with open(binary, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(binary, 0o755)
        cs = ["compute-sanitizer", "--tool", "memcheck"]
        check("sanitizer before a direct binary", gpu_check.sanitized_command([binary, "--x"], build, cs) ==
              cs + [binary, "--x"])
        check("sanitizer before the binary mprun starts",
              gpu_check.sanitized_command(["/src/launch/mprun", "-np", "2", binary], build, cs) ==
              ["/src/launch/mprun", "-np", "2"] + cs + [binary])
        check("mpirun's options stay in front (the GPU tests run --bind-to none)",
              gpu_check.sanitized_command(["/src/launch/mprun", "-np", "2", "--bind-to", "none", binary], build, cs) ==
              ["/src/launch/mprun", "-np", "2", "--bind-to", "none"] + cs + [binary])
        check("no binary of the build: no command", gpu_check.sanitized_command(["/bin/true"], build, cs) is None)
        clean = "========= COMPUTE-SANITIZER\n[  PASSED  ] 3 tests.\n========= ERROR SUMMARY: 0 errors\n"
        check("memcheck clean passes", gpu_check.sanitizer_verdict(clean, 0, ["no CUDA device: "])[0])
        bad = clean + "========= Invalid __global__ write of size 4 bytes\n========= ERROR SUMMARY: 2 errors\n"
        v = gpu_check.sanitizer_verdict(bad, 97, [])
        check("memcheck errors fail and are counted", not v[0] and v[1] == 2)
        check("memcheck skip fails", not gpu_check.sanitizer_verdict(
            "no CUDA device: none\n========= ERROR SUMMARY: 0 errors\n", 0, ["no CUDA device: "])[0])
        check("memcheck without a summary fails", not gpu_check.sanitizer_verdict("Segmentation fault\n", 139, [])[0])
        # memcheck runs `jobs` tests at once, a row for each (a fake sanitizer that runs the test).
        sanitizer = os.path.join(t, "fake-sanitizer")
        with open(sanitizer, "w") as f:
            f.write("#!/bin/sh\nshift 4\n\"$@\"\nrc=$?\necho \"========= ERROR SUMMARY: 0 errors\"\nexit $rc\n")
        os.chmod(sanitizer, 0o755)
        slow_test = os.path.join(build, "tests", "mp_slow_test")
        with open(slow_test, "w") as f:
            f.write("#!/bin/sh\nsleep 1\n[ \"$1\" != fail ]\n")
        os.chmod(slow_test, 0o755)
        fake_tests = [{"name": f"t{i}", "command": [slow_test] + (["fail"] if i == 3 else []), "cwd": t, "env": [],
                       "skip": []} for i in range(4)]
        real_ctests, gpu_check.gpu_ctests = gpu_check.gpu_ctests, lambda build_dir: fake_tests
        printed = io.StringIO()
        t0 = time.monotonic()
        with contextlib.redirect_stdout(printed):
            rc = gpu_check.memcheck(build, sanitizer, t, 30, 60, jobs=4)
        took = time.monotonic() - t0
        gpu_check.gpu_ctests = real_ctests
        mrows = {r["case"]: r for r in map(json.loads, printed.getvalue().splitlines())}
        check("memcheck: a row per test", sorted(mrows) == [f"memcheck_t{i}" for i in range(4)])
        check("memcheck: passes and a failing exit", [mrows[f"memcheck_t{i}"]["pass"] for i in range(4)] ==
              [True, True, True, False] and mrows["memcheck_t3"]["why"] == "exit 1" and rc == 1)
        check(f"memcheck: 4 tests of 1 s at once take under 3 s, not 4 ({took:.1f} s)", took < 3.0)
        v = gpu_check.sanitizer_verdict("========= Error: Device not supported\n========= ERROR SUMMARY: 0 errors\n",
                                        255, [])
        check("a sanitizer that refuses the device is said so", not v[0] and "refused this device" in v[2])

        # A call's summary: statuses and rows give its result.
        call_state = os.path.join(t, "call")
        os.makedirs(call_state)
        with open(os.path.join(call_state, "tests.jsonl"), "w") as f:
            f.write(json.dumps({"case": "ctest_gpu", "pass": True}) + "\n")
        with open(os.path.join(call_state, "gpt2.jsonl"), "w") as f:
            f.write(json.dumps({"case": "gpt2_124m_speed", "mfu": 0.2, "pass": False}) + "\n")

        def summary_of(lines):
            tsv = os.path.join(call_state, "call.tsv")
            with open(tsv, "w") as f:
                f.write("".join("\t".join(line) + "\n" for line in lines))
            return gpu_check.call_summary(call_state, tsv, "CPU", "x.tar.gz", 10, 480, True)

        # The table a call prints last: failed rows always, long lists of passes and measurements counted.
        many = [{"case": f"ctest_t{i}", "pass": True} for i in range(9)] + [{"case": "ctest_bad", "pass": False}]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            n = gpu_check.print_rows("tests", many, compact=True)
        lines = printed.getvalue().splitlines()
        check("compact table: the failure and a count", n == 1 and len(lines) == 2 and "FAIL tests" in lines[0]
              and "9 more rows" in lines[1])
        gemm_like = [{"case": "peak_8192_bf16", "value": 1}] + [{"case": f"c{i}_b4", "value": i} for i in range(9)] + [
            {"case": "step_gemms_b4", "value": 2}]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            gpu_check.print_rows("gemm", gemm_like, compact=True)
        lines = printed.getvalue().splitlines()
        check("compact table: the headline measurements", len(lines) == 3 and "peak_8192_bf16" in lines[0]
              and "step_gemms_b4" in lines[1] and "9 more rows" in lines[2])

        s = summary_of([("build", "pass", "90", ""), ("tests", "pass", "60", "")])
        check("summary pass", s["result"] == "pass" and s["stages"]["tests"]["rows"][0]["case"] == "ctest_gpu"
              and s["stages_asked"] == ["build", "tests"] and s["commit"])
        check("summary of a timeout is incomplete",
              summary_of([("build", "pass", "90", ""), ("tests", "timeout", "300", "stopped")])["result"] == "incomplete")
        check("summary of a skip is incomplete, without rows", (lambda s: s["result"] == "incomplete" and "rows" not in
              s["stages"]["tests"])(summary_of([("build", "pass", "9", ""), ("tests", "skipped", "0", "no time")])))
        check("summary of a failed stage fails",
              summary_of([("build", "fail", "9", "exit 1"), ("tests", "skipped", "0", "")])["result"] == "fail")
        check("summary of a missed target fails", summary_of([("gpt2", "pass", "200", "")])["result"] == "fail")

        # Several calls merged: the last run of a stage wins; a stage that did not pass is a failed row.
        paths = []
        for i, lines in enumerate([[("build", "pass", "90", ""), ("tests", "fail", "60", "exit 1")],
                                   [("build", "pass", "2", ""), ("tests", "pass", "50", "")]]):
            paths.append(os.path.join(t, f"summary{i}.json"))
            gpu_check.write_json(paths[-1], summary_of(lines))
        merged = os.path.join(t, "merged.json")
        ok = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py"), "merge", merged] + paths,
                            capture_output=True, text=True)
        m = json.load(open(merged))
        check("merge of passes exits 0", ok.returncode == 0 and len(m["calls"]) == 2
              and m["stages"]["tests"] == [{"case": "ctest_gpu", "pass": True}])
        bad = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py"), "merge", merged,
                              paths[1], paths[0]], capture_output=True, text=True)
        check("merge ending on a failed stage exits 1", bad.returncode == 1 and "FAIL tests" in bad.stdout)

        # A tree copied afresh: unchanged sources get their old mtimes back, changed ones keep theirs.
        tree = os.path.join(t, "tree")
        os.makedirs(os.path.join(tree, "kernels"))
        os.makedirs(os.path.join(tree, "build-gpu"))
        for name, text in (("kernels/a.cu", "a"), ("kernels/b.cc", "b"), ("build-gpu/x.o", "o")):
            with open(os.path.join(tree, name), "w") as f:
                f.write(text)
            os.utime(os.path.join(tree, name), ns=(10**18, 10**18))
        stamp = os.path.join(t, "sources.stamp")
        check("mtimes saved, build folder left out", gpu_check.save_mtimes(stamp, tree) == 2)
        for name in ("kernels/a.cu", "kernels/b.cc"):
            os.utime(os.path.join(tree, name), ns=(2 * 10**18, 2 * 10**18))
        with open(os.path.join(tree, "kernels/b.cc"), "w") as f:
            f.write("changed")
        check("one mtime put back", gpu_check.restore_mtimes(stamp, tree) == 1)
        check("unchanged source: its old mtime", os.stat(os.path.join(tree, "kernels/a.cu")).st_mtime_ns == 10**18)
        check("changed source: its new mtime", os.stat(os.path.join(tree, "kernels/b.cc")).st_mtime_ns != 10**18)
        check("no stamp: nothing to do", gpu_check.restore_mtimes(os.path.join(t, "none"), tree) == 0)

    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""tests/check_gpu_check.py: the judgements of scripts/gpu_check.py on
made-up run directories, so they are known to pass and fail as documented
before a GPU ever runs them: loss agreement (fp32 per step, bf16 final
band, NaN), the speed row (tokens/s median, MFU, ratios to PyTorch, a
failed torch.compile) and the report's exit status."""
import json
import os
import subprocess
import sys
import tempfile

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
            f.write(json.dumps({"suite": "torch_gpt", "case": "gpt2_124m_amp_bf16", "value": 100000.0}) + "\n")
            f.write(json.dumps({"suite": "torch_gpt", "case": "gpt2_124m_amp_bf16_compile", "error": "boom"}) + "\n")
        s = gpu_check.speed(fast, 989.0, torch_file, 5)
        # steps 6..10: tokens/s 200005 .. 200009, median 200007
        check("speed median", s["tokens_per_s"] == 200007.0)
        check("flops per token from the metrics", s["flops_per_token"] == 7.0e8)
        check("mfu", abs(s["mfu"] - round(200007.0 * 7e8 / 989e12, 4)) < 1e-12)
        check("ratio to eager", s["ratio_to_torch_amp_bf16"] == round(200007.0 / 100000.0, 3))
        check("compile error kept", s["torch_amp_bf16_compile_error"] == "boom")
        check("target judged", s["pass"] is False)  # mfu 0.14 < 0.40

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

    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())

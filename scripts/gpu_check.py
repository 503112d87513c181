#!/usr/bin/env python3
"""scripts/gpu_check.py: the judgements and the report of scripts/gpu_check
(plain Python 3, no packages), so that they can be tested without a GPU
(tests/check_gpu_check.py).

  agree GPU_RUN CPU_RUN --recipe R   the loss curves of two mp_worker run
                                     directories (metrics.jsonl) against the
                                     stated tolerance of recipe R; one JSON line
  speed RUN --peak-tflops P [--torch FILE] [--skip N]
                                     tokens/s (median after the first N steps),
                                     MFU = tokens/s x F / P (F: the model's
                                     FLOPs per token as mp_worker logs them,
                                     6 N + 12 L C T), and the ratio to
                                     PyTorch's rows in FILE; one JSON line
  report STATE_DIR OUT_JSON          every STAGE.jsonl of STATE_DIR in one JSON
                                     object, and a table on stdout

Tolerances (docs/benchmarks.md "GPU check"): the fp32 recipe agrees with the
CPU at every step within FP32_REL_TOL of the CPU's loss (the GEMMs and
reductions sum in other orders, and 100 steps of training amplify the
differences); bf16 recipes end within BF16_FINAL_BAND nats of the CPU's
final loss (bf16 rounding flips differ, the curves wander apart step by
step, the end point is what matters).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys

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


def speed(run_dir, peak_tflops, torch_file, skip):
    rows = read_metrics(run_dir)
    timed = [r for r in rows if r["step"] > skip] or rows
    tps = statistics.median(r["tokens_per_s"] for r in timed)
    flops_per_token = round(timed[0]["model_flops_per_s"] / timed[0]["tokens_per_s"])
    out = {"case": "gpt2_124m_speed", "tokens_per_s": round(tps, 1), "steps_timed": len(timed),
           "flops_per_token": flops_per_token, "peak_tflops": peak_tflops,
           "mfu": round(tps * flops_per_token / (peak_tflops * 1e12), 4),
           "final_loss": rows[-1]["loss"]}
    if torch_file and os.path.exists(torch_file):
        with open(torch_file) as f:
            for line in f:
                if not line.startswith("{"):
                    continue
                t = json.loads(line)
                mode = t.get("case", "").replace("gpt2_124m_", "")
                if "value" in t:
                    out[f"torch_{mode}_tokens_per_s"] = t["value"]
                    out[f"ratio_to_torch_{mode}"] = round(tps / t["value"], 3)
                elif "error" in t:
                    out[f"torch_{mode}_error"] = t["error"]
    if "ratio_to_torch_amp_bf16" in out:
        out["target"] = "mfu >= 0.40 and ratio_to_torch_amp_bf16 >= 1.3"
        out["pass"] = out["mfu"] >= 0.40 and out["ratio_to_torch_amp_bf16"] >= 1.3
    return out


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def report(state_dir, out_json):
    result = {"commit": git_commit(), "stages": {}}
    for name in sorted(os.listdir(state_dir)):
        if not name.endswith(".jsonl"):
            continue
        rows = []
        with open(os.path.join(state_dir, name)) as f:
            for line in f:
                if line.startswith("{"):
                    rows.append(json.loads(line))
        result["stages"][name[:-len(".jsonl")]] = rows
    os.makedirs(os.path.dirname(os.path.abspath(out_json)), exist_ok=True)
    with open(out_json, "w") as f:
        json.dump(result, f, indent=1)
    failed = 0
    print(f"gpu_check report, commit {result['commit']}: {out_json}")
    for stage, rows in result["stages"].items():
        for r in rows:
            verdict = {True: "PASS", False: "FAIL"}.get(r.get("pass"), "    ")
            failed += r.get("pass") is False
            keys = [k for k in r if k not in ("case", "pass", "suite")][:6]
            print(f"  {verdict} {stage:8} {r.get('case', '?'):34} " + ", ".join(f"{k}={r[k]}" for k in keys))
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
    r = sub.add_parser("report")
    r.add_argument("state_dir")
    r.add_argument("out_json")
    args = ap.parse_args()
    if args.cmd == "agree":
        row = agree(args.gpu_dir, args.cpu_dir, args.recipe)
        print(json.dumps(row))
        return 0 if row["pass"] else 1
    if args.cmd == "speed":
        print(json.dumps(speed(args.run_dir, args.peak_tflops, args.torch, args.skip)))
        return 0
    return report(args.state_dir, args.out_json)


if __name__ == "__main__":
    sys.exit(main())

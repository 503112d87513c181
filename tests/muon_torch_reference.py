#!/usr/bin/env python3
"""The PyTorch reference for optim/muon.h: writes tests/golden/muon_torch.json.

tests/test_muon.cc (MuonTorch.*) runs muon_step_cpu on the same matrices and
gradients and compares with torch.optim.Muon's parameters and momentum
buffers after three steps. The test suite needs only the committed golden
file, never torch.

Regenerate (needs torch >= 2.9, which has torch.optim.Muon; CPU only):

    .venv/bin/python tests/muon_torch_reference.py            # writes tests/golden/muon_torch.json
    .venv/bin/python tests/muon_torch_reference.py --check    # compares instead of writing

and commit the JSON. Written with PyTorch 2.15.0 (the version is recorded in
the file).

Each setting runs twice:
- "bfloat16": torch.optim.Muon as it is: fp32 parameters, gradients and
  momentum buffers, Newton-Schulz in bf16. The momentum buffers depend on the
  gradients alone, so mp must give their bits exactly; the parameters agree
  to the bf16 iteration's accuracy.
- "float64": the same optimizer with float64 parameters and gradients and
  torch's own _zeropower_via_newtonschulz with its one dtype, torch.bfloat16,
  replaced by torch.float64 (its source, edited here, nothing else
  changed). mp's fp32 iteration must agree with it to fp32 accuracy: this
  pins every formula of the step (lerp directions, Nesterov, decay before
  the update, the adjusted lr, the transposes) tightly.

Matrices and gradients come from a 32-bit LCG (integer arithmetic only, as in
tests/gpt_torch_reference.py), rounded to 5 decimals so that their text is
exact on both sides. The three shapes are wide, tall (Newton-Schulz works on
the transpose) and square.
"""

import argparse
import inspect
import json
import os
import sys

import torch
import torch.optim._muon as muon_module

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "muon_torch.json")
STEPS = 3
MATRICES = [("wide", [12, 20]), ("tall", [20, 12]), ("square", [16, 16])]
SETTINGS = [
    # torch's defaults but lr.
    {"name": "defaults", "lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
     "ns_coefficients": [3.4445, -4.7750, 2.0315], "ns_steps": 5, "eps": 1e-7, "adjust_lr_fn": "original"},
    # Every setting changed.
    {"name": "heavy_ball", "lr": 0.05, "weight_decay": 0.02, "momentum": 0.8, "nesterov": False,
     "ns_coefficients": [3.0, -3.2, 1.2], "ns_steps": 3, "eps": 1e-6, "adjust_lr_fn": "match_rms_adamw"},
    {"name": "spectral", "lr": 0.03, "weight_decay": 0.0, "momentum": 0.3, "nesterov": True,
     "ns_coefficients": [3.4445, -4.7750, 2.0315], "ns_steps": 5, "eps": 1e-7, "adjust_lr_fn": "spectral_unclamped"},
]


def lcg(seed, n):
    """n 16-bit words from the Numerical Recipes 32-bit LCG (the high half of each state)."""
    state, out = seed, []
    for _ in range(n):
        state = (1664525 * state + 1013904223) % 2**32
        out.append(state >> 16)
    return out


def values(seed, n, amp):
    return [round(amp * (w / 32768.0 - 1.0), 5) for w in lcg(seed, n)]


def ns_in(dtype):
    """torch's _zeropower_via_newtonschulz with its one dtype, torch.bfloat16,
    replaced by `dtype` ("torch.float64", "torch.float32")."""
    source = inspect.getsource(muon_module._zeropower_via_newtonschulz)
    if source.count("torch.bfloat16") != 1:
        sys.exit("torch's _zeropower_via_newtonschulz changed: expected one torch.bfloat16 in\n" + source)
    namespace = dict(muon_module.__dict__)
    exec(source.replace("torch.bfloat16", dtype), namespace)
    return namespace["_zeropower_via_newtonschulz"]


def run(setting, dtype, param0, grads, shape):
    p = torch.nn.Parameter(torch.tensor(param0, dtype=dtype).view(shape))
    opt = torch.optim.Muon([p], lr=setting["lr"], weight_decay=setting["weight_decay"],
                           momentum=setting["momentum"], nesterov=setting["nesterov"],
                           ns_coefficients=tuple(setting["ns_coefficients"]), eps=setting["eps"],
                           ns_steps=setting["ns_steps"], adjust_lr_fn=setting["adjust_lr_fn"])
    for g in grads:
        p.grad = torch.tensor(g, dtype=dtype).view(shape)
        opt.step()
    buf = opt.state[p]["momentum_buffer"]
    return p.detach().flatten().tolist(), buf.flatten().tolist()


def fmt(v, dtype):
    return "%.9g" % v if dtype == torch.float32 else repr(float(v))


def flist(vs, dtype):
    return "[" + ",".join(fmt(v, dtype) for v in vs) + "]"


def build():
    torch.set_num_threads(1)
    matrices = []
    for k, (name, shape) in enumerate(MATRICES):
        n = shape[0] * shape[1]
        param = values(2000 + k, n, 0.5)
        grads = [values(3000 + 10 * k + s, n, 1.0) for s in range(STEPS)]
        matrices.append((name, shape, param, grads))
    out = ["{", '"torch_version": "%s",' % torch.__version__, '"steps": %d,' % STEPS, '"matrices": [']
    for i, (name, shape, param, grads) in enumerate(matrices):
        out.append('{"name": "%s", "shape": %s,' % (name, json.dumps(shape)))
        out.append(' "param": %s,' % json.dumps(param, separators=(",", ":")))
        out.append(' "grads": %s}%s' % (json.dumps(grads, separators=(",", ":")), "," if i + 1 < len(matrices) else ""))
    out.append("],")
    out.append('"runs": [')
    runs = []
    patched = ns_in("torch.float64")
    original = muon_module._zeropower_via_newtonschulz
    for setting in SETTINGS:
        for dtype_name, dtype in (("bfloat16", torch.float32), ("float64", torch.float64)):
            muon_module._zeropower_via_newtonschulz = original if dtype == torch.float32 else patched
            try:
                results = [run(setting, dtype, param, grads, shape) for (_, shape, param, grads) in matrices]
            finally:
                muon_module._zeropower_via_newtonschulz = original
            lines = ['{"setting": %s, "iteration": "%s", "results": [' % (json.dumps(setting), dtype_name)]
            for j, (p, b) in enumerate(results):
                lines.append(' {"param": %s, "momentum_buffer": %s}%s' %
                             (flist(p, dtype), flist(b, dtype), "," if j + 1 < len(results) else ""))
            lines.append("]}")
            runs.append("\n".join(lines))
    out.append(",\n".join(runs))
    out.append("]")
    out.append("}")
    return "\n".join(out) + "\n"


def main(build_text=None, default_out=DEFAULT_OUT, description=__doc__):
    """Writes build_text()'s golden file to --out, or with --check compares."""
    parser = argparse.ArgumentParser(description=description.split("\n")[0])
    parser.add_argument("--out", default=default_out)
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = parser.parse_args()
    text = (build_text or build)()
    if args.check:
        with open(args.out) as f:
            same = f.read() == text
        print("same" if same else "differs")
        return 0 if same else 1
    with open(args.out, "w") as f:
        f.write(text)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The PyTorch reference for optimizer kind MUON on mp's GPT: writes tests/golden/muon_gpt_torch.json.

tests/mpi/test_engine_muon.cc (MuonEngineTest.TwentyGptStepsMatchTorchOptimMuonAndAdamW)
trains mp's built-in GPT through the engine for 20 steps with the same
initial weights, batches and settings, and compares its losses with the
ones recorded here. The test suite needs only the committed golden file,
never torch.

Regenerate (needs torch >= 2.9, which has torch.optim.Muon; CPU only):

    .venv/bin/python tests/muon_gpt_torch_reference.py            # writes the file
    .venv/bin/python tests/muon_gpt_torch_reference.py --check    # compares instead of writing

The model is tests/gpt_torch_reference.py's (GPT-2 from torch primitives,
its tiny config and its LCG parameters), here in float32. Each step's
micro-batch is batch x context tokens from the same LCG (seed 20000 +
step). The optimizers, stepping together on the same parameter split as
mp's (Note [Muon and the GPT] in optim/muon.h):

- torch.optim.Muon on the blocks' 2-D weights, lr 0.02, weight decay 0.1,
  its defaults otherwise. mp stores these weights [in, out] and reads their
  adjusted lr as (out, in), an nn.Linear's; so here Muon holds each as an
  [out, in] tensor, and the model multiplies by its transpose.
- torch.optim.AdamW on everything else: lr 0.01, betas (0.9, 0.999), eps
  1e-8, weight decay 0.01 on the 2-D wte and wpe and none on the 1-D
  parameters (mp's muon.adamw_* and weight_decay_1d).

Two runs: "bfloat16", torch.optim.Muon as it is (Newton-Schulz in bf16),
and "float32", torch's own _zeropower_via_newtonschulz with its one dtype,
torch.bfloat16, replaced by torch.float32 (its source, edited here).
"""

import json
import math
import os
import sys

import torch
import torch.optim._muon as muon_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_torch_reference as ref  # noqa: E402
import muon_torch_reference as muon_ref  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "muon_gpt_torch.json")
STEPS = 20
MUON = {"lr": 0.02, "weight_decay": 0.1}
ADAMW = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
MATRICES = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def step_tokens(cfg, step):
    n = cfg["batch"] * cfg["context"]
    words = [w % cfg["vocab"] for w in ref.lcg(20000 + step, 2 * n)]
    return words[:n], words[n:]


def train(cfg, specs, values):
    stored = {}  # what the optimizers hold: matrices as [out, in]
    for name, shape, _, _ in specs:
        t = torch.tensor(values[name], dtype=torch.float32).view(shape)
        stored[name] = torch.nn.Parameter(t.t().contiguous() if name.endswith(MATRICES) else t)
    muon = [p for n, p in stored.items() if n.endswith(MATRICES)]
    decayed = [p for n, p in stored.items() if not n.endswith(MATRICES) and p.dim() == 2]
    flat = [p for n, p in stored.items() if not n.endswith(MATRICES) and p.dim() != 2]
    opts = [torch.optim.Muon(muon, lr=MUON["lr"], weight_decay=MUON["weight_decay"]),
            torch.optim.AdamW([{"params": decayed}, {"params": flat, "weight_decay": 0.0}], lr=ADAMW["lr"],
                              betas=ADAMW["betas"], eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])]
    losses = []
    for step in range(STEPS):
        p = {n: (t.t() if n.endswith(MATRICES) else t) for n, t in stored.items()}
        inputs, targets = step_tokens(cfg, step)
        loss, _ = ref.forward(cfg, p, inputs, targets, ref.LN_EPS, ref.GELU_COEF, True)
        for o in opts:
            o.zero_grad()
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.item())
    return losses


def build():
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    cfg = ref.CONFIG
    specs = ref.param_specs(cfg)
    values = {name: ref.param_values(k, math.prod(shape), base, amp) for k, (name, shape, base, amp) in enumerate(specs)}
    runs = {}
    original, fp32 = muon_module._zeropower_via_newtonschulz, muon_ref.ns_in("torch.float32")
    for iteration in ("bfloat16", "float32"):
        muon_module._zeropower_via_newtonschulz = original if iteration == "bfloat16" else fp32
        try:
            runs[iteration] = train(cfg, specs, values)
        finally:
            muon_module._zeropower_via_newtonschulz = original
    tokens = [step_tokens(cfg, s) for s in range(STEPS)]
    out = ["{", '"generator": "tests/muon_gpt_torch_reference.py (PyTorch %s, float32)",' % torch.__version__,
           '"config": {"vocab": %d, "context": %d, "channels": %d, "heads": %d, "layers": %d, "micro_batch_size": %d},'
           % (cfg["vocab"], cfg["context"], cfg["channels"], cfg["heads"], cfg["layers"], cfg["batch"]),
           '"muon": %s,' % json.dumps(MUON), '"adamw": %s,' % json.dumps(ADAMW), '"steps": %d,' % STEPS,
           '"inputs": %s,' % json.dumps([t[0] for t in tokens], separators=(",", ":")),
           '"targets": %s,' % json.dumps([t[1] for t in tokens], separators=(",", ":")),
           '"losses": {"bfloat16": %s, "float32": %s},' % (json.dumps(runs["bfloat16"]), json.dumps(runs["float32"])),
           '"params": [']
    for i, (name, shape, _, _) in enumerate(specs):
        out.append('{"name": "%s", "shape": %s, "values": %s}%s' % (
            name, json.dumps(shape), json.dumps(values[name], separators=(",", ":")), "," if i + 1 < len(specs) else ""))
    out += ["]", "}"]
    text = "\n".join(out) + "\n"
    json.loads(text)
    return text


if __name__ == "__main__":
    sys.exit(muon_ref.main(build, DEFAULT_OUT, __doc__))

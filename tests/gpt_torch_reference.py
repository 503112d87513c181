#!/usr/bin/env python3
"""The PyTorch reference for models/gpt.h: writes tests/golden/gpt_tiny.json.

tests/test_gpt_torch.cc checks gpt_loss_and_grads<double> and <float>
(models/gpt.cc) against this file: the loss, every parameter's gradient and
the logits of the first two positions. The test suite needs only the
committed golden file, never torch.

Regenerate (needs torch; any recent version, CPU only, float64):

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch
    /tmp/torchvenv/bin/python tests/gpt_torch_reference.py            # writes tests/golden/gpt_tiny.json
    /tmp/torchvenv/bin/python tests/gpt_torch_reference.py --check    # compares instead of writing

and commit the JSON. Regenerating on another machine or torch version may
change the last digits of the float64 values (the test's tolerances allow
for that); the parameters and tokens are exact (below) and never change.

Checking that the test notices a wrong model: write a golden file of a
deliberately different model and watch GptTorch* fail, then regenerate:

    /tmp/torchvenv/bin/python tests/gpt_torch_reference.py --ln-eps 1e-6
    /tmp/torchvenv/bin/python tests/gpt_torch_reference.py --gelu-coef 0.0447
    /tmp/torchvenv/bin/python tests/gpt_torch_reference.py --no-pad-slice

The model is GPT-2 as models/gpt.h describes it, written here from torch
primitives: token + position embeddings; pre-LN blocks x = x + attn(ln_1(x)),
x = x + mlp(ln_2(x)); causal multi-head attention with an explicit masked
softmax of q k^T / sqrt(head_dim); the tanh GELU; ln_f; logits = ln_f(x)
wte^T over the padded wte (vocab rounded up to a multiple of 128), sliced to
the first `vocab` ids before the mean cross-entropy. LayerNorm eps 1e-5.
Weights in the Hugging Face Conv1D layout [in, out] (y = x w + b).

Parameters and tokens come from a 32-bit LCG (integer arithmetic only, so
they do not depend on any RNG library), and the parameters are rounded to 5
decimals so that their text in the JSON is exact on both sides: parameter k
(in the order of Gpt::spec_for), element j (row-major) is
    round(base + amp * u, 5),  u uniform in [-1, 1) from lcg(seed = 1000 + k)
with base 1 for LayerNorm weights, else 0, and amp chosen so that the
activations are O(1): attention and GELU far from linear, which the 0.02
init would not give. (Not a sin formula: sin(a + b j) over a row-major matrix
is rank 2.) The padded rows of wte get values too: they must not change the
loss and get zero gradient.
"""

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

CONFIG = {"vocab": 70, "context": 8, "channels": 12, "heads": 3, "layers": 2, "batch": 3}
VOCAB_MULTIPLE = 128
LN_EPS = 1e-5
GELU_COEF = 0.044715
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "gpt_tiny.json")


def padded_vocab(vocab):
    return (vocab + VOCAB_MULTIPLE - 1) // VOCAB_MULTIPLE * VOCAB_MULTIPLE


def param_specs(cfg):
    """(name, shape, base, amp) in the order of Gpt::spec_for (units embed, h0.., head)."""
    c, vp, t = cfg["channels"], padded_vocab(cfg["vocab"]), cfg["context"]
    specs = [("wte", [vp, c], 0.0, 0.5), ("wpe", [t, c], 0.0, 0.3)]
    for i in range(cfg["layers"]):
        h = f"h{i}"
        specs += [
            (f"{h}.ln_1.weight", [c], 1.0, 0.2),
            (f"{h}.ln_1.bias", [c], 0.0, 0.1),
            (f"{h}.attn.c_attn.weight", [c, 3 * c], 0.0, 0.5),
            (f"{h}.attn.c_attn.bias", [3 * c], 0.0, 0.1),
            (f"{h}.attn.c_proj.weight", [c, c], 0.0, 0.3),
            (f"{h}.attn.c_proj.bias", [c], 0.0, 0.1),
            (f"{h}.ln_2.weight", [c], 1.0, 0.2),
            (f"{h}.ln_2.bias", [c], 0.0, 0.1),
            (f"{h}.mlp.c_fc.weight", [c, 4 * c], 0.0, 0.5),
            (f"{h}.mlp.c_fc.bias", [4 * c], 0.0, 0.1),
            (f"{h}.mlp.c_proj.weight", [4 * c, c], 0.0, 0.2),
            (f"{h}.mlp.c_proj.bias", [c], 0.0, 0.1),
        ]
    specs += [("ln_f.weight", [c], 1.0, 0.2), ("ln_f.bias", [c], 0.0, 0.1)]
    return specs


def lcg(seed, n):
    """n 16-bit words from the Numerical Recipes 32-bit LCG (the high half of each state)."""
    state, out = seed, []
    for _ in range(n):
        state = (1664525 * state + 1013904223) % 2**32
        out.append(state >> 16)
    return out


def param_values(k, numel, base, amp):
    return [round(base + amp * (w / 32768.0 - 1.0), 5) for w in lcg(1000 + k, numel)]


def tokens(cfg):
    """inputs, targets: batch * context ints < vocab each."""
    n = cfg["batch"] * cfg["context"]
    out = [w % cfg["vocab"] for w in lcg(12345, 2 * n)]
    return out[:n], out[n:]


def layer_norm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def gelu(x, coef):
    if coef == GELU_COEF:
        return F.gelu(x, approximate="tanh")
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + coef * x**3)))


def attention(x, w, b, proj_w, proj_b, heads):
    bsz, t, c = x.shape
    hd = c // heads
    q, k, v = (x @ w + b).split(c, dim=-1)  # Conv1D: [in, out]; q | k | v
    q, k, v = (z.view(bsz, t, heads, hd).transpose(1, 2) for z in (q, k, v))  # [B, NH, T, hd]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(bsz, t, c)  # heads side by side
    return y @ proj_w + proj_b


def forward(cfg, p, inputs, targets, ln_eps, gelu_coef, pad_slice):
    bsz, t, vocab = cfg["batch"], cfg["context"], cfg["vocab"]
    idx = torch.tensor(inputs, dtype=torch.long).view(bsz, t)
    tgt = torch.tensor(targets, dtype=torch.long).view(bsz, t)
    x = p["wte"][idx] + p["wpe"][torch.arange(t)]
    for i in range(cfg["layers"]):
        h = f"h{i}"
        a = layer_norm(x, p[f"{h}.ln_1.weight"], p[f"{h}.ln_1.bias"], ln_eps)
        x = x + attention(a, p[f"{h}.attn.c_attn.weight"], p[f"{h}.attn.c_attn.bias"],
                          p[f"{h}.attn.c_proj.weight"], p[f"{h}.attn.c_proj.bias"], cfg["heads"])
        m = layer_norm(x, p[f"{h}.ln_2.weight"], p[f"{h}.ln_2.bias"], ln_eps)
        m = gelu(m @ p[f"{h}.mlp.c_fc.weight"] + p[f"{h}.mlp.c_fc.bias"], gelu_coef)
        x = x + (m @ p[f"{h}.mlp.c_proj.weight"] + p[f"{h}.mlp.c_proj.bias"])
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], ln_eps)
    logits = x @ p["wte"].t()  # tied head over the padded wte: [B, T, Vp]
    used = logits[..., :vocab] if pad_slice else logits
    loss = F.cross_entropy(used.reshape(bsz * t, -1), tgt.view(-1))  # mean over B * T
    return loss, logits


def fmt(v):
    return repr(float(v))  # shortest text that round-trips the double (at most 17 digits)


def flist(values):
    return "[" + ",".join(fmt(v) for v in values) + "]"


def build(args):
    torch.set_default_dtype(torch.float64)
    cfg = CONFIG
    specs = param_specs(cfg)
    params, values = {}, {}
    for k, (name, shape, base, amp) in enumerate(specs):
        values[name] = param_values(k, math.prod(shape), base, amp)
        params[name] = torch.tensor(values[name], dtype=torch.float64).view(shape).requires_grad_(True)
    inputs, targets = tokens(cfg)
    loss, logits = forward(cfg, params, inputs, targets, args.ln_eps, args.gelu_coef, not args.no_pad_slice)
    loss.backward()
    vocab, vp = cfg["vocab"], padded_vocab(cfg["vocab"])
    if not args.no_pad_slice:
        assert torch.all(params["wte"].grad[vocab:] == 0), "padded wte rows must get zero gradient"

    # Hand-written so that each parameter is a few lines of a diff.
    out = ["{"]
    out.append('"generator": "tests/gpt_torch_reference.py (PyTorch %s, float64)",' % torch.__version__.split("+")[0])
    if args.ln_eps != LN_EPS or args.gelu_coef != GELU_COEF or args.no_pad_slice:
        out.append('"perturbed": "ln_eps %r gelu_coef %r pad_slice %s",' % (args.ln_eps, args.gelu_coef,
                                                                           not args.no_pad_slice))
    out.append('"config": {"vocab": %d, "padded_vocab": %d, "context": %d, "channels": %d, "heads": %d, '
               '"layers": %d, "micro_batch_size": %d},' % (vocab, vp, cfg["context"], cfg["channels"], cfg["heads"],
                                                          cfg["layers"], cfg["batch"]))
    out.append('"inputs": %s,' % json.dumps(inputs, separators=(",", ":")))
    out.append('"targets": %s,' % json.dumps(targets, separators=(",", ":")))
    out.append('"loss": %s,' % fmt(loss.item()))
    rows = logits.detach().reshape(-1, vp)[:2, :vocab]
    out.append('"logits": {"rows": [0, 1], "values": [%s, %s]},' % (flist(rows[0].tolist()), flist(rows[1].tolist())))
    out.append('"params": [')
    for i, (name, shape, _, _) in enumerate(specs):
        out.append('{"name": "%s", "shape": %s,' % (name, json.dumps(shape)))
        out.append('"values": %s,' % flist(values[name]))
        out.append('"grad": %s}%s' % (flist(params[name].grad.reshape(-1).tolist()), "," if i + 1 < len(specs) else ""))
    out.append("]")
    out.append("}")
    text = "\n".join(out) + "\n"
    json.loads(text)  # well-formed
    return text, loss.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    ap.add_argument("--ln-eps", type=float, default=LN_EPS, help="(sensitivity checks only)")
    ap.add_argument("--gelu-coef", type=float, default=GELU_COEF, help="(sensitivity checks only)")
    ap.add_argument("--no-pad-slice", action="store_true",
                    help="softmax over the padded vocabulary (sensitivity checks only)")
    args = ap.parse_args()
    text, loss = build(args)
    if args.check:
        with open(args.out) as f:
            old = json.load(f)
        new = json.loads(text)
        worst = max(abs(a - b) / max(max(abs(x) for x in np["grad"]), 1e-300)
                    for op, np in zip(old["params"], new["params"]) for a, b in zip(op["grad"], np["grad"]))
        print(f"loss {loss!r} (file {old['loss']!r}); max grad difference / max |grad| {worst:.3e}")
        same = old["inputs"] == new["inputs"] and all(a["values"] == b["values"]
                                                        for a, b in zip(old["params"], new["params"]))
        sys.exit(0 if same and worst < 1e-12 and abs(loss - old["loss"]) <= 1e-14 * loss else 1)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}: {len(text)} bytes, loss {loss!r}")


if __name__ == "__main__":
    main()

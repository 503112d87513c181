"""mp.torch.shard under optimizer kind MUON on one rank (CTest python_torch_muon).

Hugging Face's GPT-2 trained in the test's own loop equals plain PyTorch
with torch.optim.Muon on the blocks' matrices (Conv1D weights [in, out],
adjust_lr_fn reading that stored shape) and torch.optim.AdamW on the rest
(embeddings, tied head, norms, biases), stepping together on the same
batches from the same weights, fp32 recipe, deterministic, 20 steps:
- mp's default Newton-Schulz in bf16 against torch's (bf16 too, but its
  own matmuls): every step's loss within 1% (measured on a 2-core Xeon with
  avx512_bf16: worst 4.8e-5, at step 16);
- Newton-Schulz in fp32 (iteration_dtype: FP32) against torch.optim.Muon
  with its Newton-Schulz run in fp32 (the same formula): within 1e-5
  (measured there: worst 9.5e-8, at step 17).
The test prints each run's worst difference and its step.
The default choice of Muon's parameters and the user's (a callable, a list
of names) are what ShardedModel.muon_params says and what the engine marks;
a chosen parameter that is not 2-D, or an unknown name, is named; with
other optimizer kinds nothing is marked."""
import copy

import pytest
import torch
import torch.optim._muon as torch_muon

import gpt2_case as case
import mp
import mp.torch

mp.init()
torch.set_num_threads(1)

STEPS = 20
# The blocks' 2-D weights, in unit order: the default choice.
BLOCK_MATRICES = tuple(f"transformer.h.{layer}.{name}.weight" for layer in range(case.LAYERS)
                       for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"))


def newton_schulz_fp32(grad, ns_coefficients, ns_steps, eps):
    """torch.optim._muon._zeropower_via_newtonschulz (PyTorch 2.15) with its
    iteration in fp32 instead of bf16."""
    a, b, c = ns_coefficients
    x = grad.to(dtype=torch.float32, copy=True)
    if grad.size(0) > grad.size(1):
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram = x @ x.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, update, x, beta=a)
    if grad.size(0) > grad.size(1):
        x = x.T
    return x


def torch_losses(model, steps, matrices):
    """Plain PyTorch: torch.optim.Muon on `matrices` (names), AdamW on the
    rest, decaying the 2-D ones as mp's AdamW does (1-D parameters are not
    decayed: weight_decay_1d is false); clipping over every gradient."""
    named = dict(model.named_parameters())
    muon_params = [named[n] for n in matrices]
    chosen = {id(p) for p in muon_params}
    rest = [p for p in model.parameters() if id(p) not in chosen]
    muon = torch.optim.Muon(muon_params, lr=case.MUON_LR, weight_decay=case.MUON_WEIGHT_DECAY, momentum=0.95,
                            nesterov=True, ns_steps=5, adjust_lr_fn="original")
    adamw = torch.optim.AdamW([{"params": [p for p in rest if p.dim() >= 2], "weight_decay": case.ADAMW_WEIGHT_DECAY},
                               {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}],
                              lr=case.LR, betas=case.ADAMW_BETAS, eps=1e-8, foreach=False)
    losses = []
    for s in range(steps):
        loss = case.forward(model, s)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), case.CLIP)
        muon.step()
        adamw.step()
        muon.zero_grad()
        adamw.zero_grad()
        losses.append(loss.item())
    return losses


def shard_losses(model, steps, config, muon=None):
    sharded = mp.torch.shard(model, config=config, muon=muon)
    losses = []
    for s in range(steps):
        case.forward(model, s).backward()
        losses.append(sharded.step().loss)
    return sharded, losses


def marked(sharded):
    return tuple(d["name"] for u in range(sharded.engine.num_units) for d in sharded.engine.params(u) if d["muon"])


def compare(ours, theirs, what, tolerance):
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, theirs)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    print(f"{what}: worst relative loss difference over {len(rel)} steps {rel[worst]:.3g} (step {worst + 1}); "
          f"loss {ours[0]:.4f} -> {ours[-1]:.4f}")
    for s, (a, b, r) in enumerate(zip(ours, theirs, rel), 1):
        assert r <= tolerance, f"{what} step {s}: mp {a!r}, torch {b!r}, relative difference {r:.3g}"
    assert ours[-1] < 0.9 * ours[0], "it did not learn"


def test_bf16_iteration_within_one_percent_of_torch_muon():
    model = case.make_model()
    reference = copy.deepcopy(model)
    sharded, ours = shard_losses(model, STEPS, case.muon_config_text())
    assert sharded.muon_params == BLOCK_MATRICES
    assert marked(sharded) == BLOCK_MATRICES
    theirs = torch_losses(reference, STEPS, BLOCK_MATRICES)
    compare(ours, theirs, "Newton-Schulz in bf16, mp against torch.optim.Muon", 0.01)
    sharded.close()


def test_fp32_iteration_equals_torch_muon_in_fp32(monkeypatch):
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", newton_schulz_fp32)
    model = case.make_model()
    reference = copy.deepcopy(model)
    sharded, ours = shard_losses(model, STEPS, case.muon_config_text(iteration="FP32"))
    theirs = torch_losses(reference, STEPS, BLOCK_MATRICES)
    compare(ours, theirs, "Newton-Schulz in fp32, mp against torch.optim.Muon in fp32", 1e-5)
    sharded.close()


def test_the_users_choice(monkeypatch):
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", newton_schulz_fp32)
    config = case.muon_config_text(iteration="FP32")
    # A callable: the MLP matrices only; trained as torch trains them.
    mlp = tuple(n for n in BLOCK_MATRICES if ".mlp." in n)
    model = case.make_model()
    reference = copy.deepcopy(model)
    sharded, ours = shard_losses(model, 5, config, muon=lambda name, p: ".mlp." in name and p.dim() == 2)
    assert sharded.muon_params == mlp and marked(sharded) == mlp
    theirs = torch_losses(reference, 5, mlp)
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 1e-5 * abs(b)
    sharded.close()
    # Names: any name of a parameter (the tied head's is the embedding's).
    sharded = mp.torch.shard(case.make_model(), config=config, muon=["lm_head.weight", BLOCK_MATRICES[0]])
    assert sharded.muon_params == ("transformer.wte.weight", BLOCK_MATRICES[0])
    sharded.close()
    # Refused, named.
    with pytest.raises(mp.ConfigError, match=r"parameter 'transformer.h.0.ln_1.weight' of shape \[64\] is marked "
                                             "for Muon, which takes 2-D matrices only"):
        mp.torch.shard(case.make_model(), config=config, muon=lambda name, p: name.startswith("transformer.h.0."))
    with pytest.raises(mp.ConfigError, match="the model has no parameter 'h.0.attn.c_attn.weight'"):
        mp.torch.shard(case.make_model(), config=config, muon=["h.0.attn.c_attn.weight"])
    with pytest.raises(mp.ConfigError, match="not a string"):
        mp.torch.shard(case.make_model(), config=config, muon=BLOCK_MATRICES[0])


def test_other_kinds_mark_nothing():
    for muon in (None, list(BLOCK_MATRICES)):
        sharded = mp.torch.shard(case.make_model(), config=case.config_text(), muon=muon)
        assert sharded.muon_params == () and marked(sharded) == ()
        sharded.close()

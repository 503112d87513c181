"""mp.torch.shard on one rank (CTest python_torch_shard): unmodified
transformers models (GPT-2 with its tied head; Llama: rotary, RMSNorm,
grouped-query attention; Qwen2: biases in attention; ResNet: BatchNorm's
buffers) trained in the test's own loop (model(...).loss, loss.backward(),
step()) equal plain PyTorch + torch.optim.AdamW with mp's parameter groups
and clipping within 1e-6 relative at every one of 20 steps (fp32,
deterministic), with torch.utils.checkpoint inside the units too, and with
the lr changed between steps; bf16_master ends within 1% of torch's
autocast; forwards without gradients work; the full state dict loads into
a fresh model with equal logits; a checkpoint resumes exactly; the fp16
recipe scales the loss as GradScaler; order mistakes and a parameter used
outside its unit are named."""
import copy

import pytest
import torch
import transformers

import gpt2_case as case
import mp
import mp.torch

mp.init()
torch.set_num_threads(1)

STEPS = 20


make = case.make
forward = case.forward


torch_adamw_losses = case.torch_adamw_losses


def shard_losses(model, steps, lr_at=None, recipe="RECIPE_FP32"):
    sharded = mp.torch.shard(model, config=case.config_text(recipe=recipe))
    out = []
    for s in range(steps):
        if lr_at is not None and lr_at(s) is not None:
            sharded.lr = lr_at(s)
        forward(model, s).backward()
        out.append(sharded.step())
    return sharded, out


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2", "resnet"])
def test_the_users_loop_equals_plain_pytorch(family):
    model = make(family)
    reference = copy.deepcopy(model)
    sharded, ours = shard_losses(model, STEPS)
    theirs = torch_adamw_losses(reference, STEPS)
    worst = 0.0
    for s, (r, want) in enumerate(zip(ours, theirs), 1):
        rel = abs(r.loss - want) / abs(want)
        worst = max(worst, rel)
        assert rel <= 1e-6, f"{family} step {s}: mp {r.loss!r}, torch {want!r}, relative difference {rel:.3g}"
    assert ours[-1].loss < 0.9 * ours[0].loss, "it did not learn"
    print(f"{family}: worst relative loss difference over {STEPS} steps: {worst:.3g}")

    # No gradients: the forward gathers, runs and releases; the full state
    # dict in a fresh model (buffers copied: they are the module's own)
    # computes the same logits.
    model.eval()
    fresh = make(family, seed=5).eval()
    fresh.load_state_dict(sharded.full_state_dict(), strict=False)
    for name, b in model.named_buffers():
        fresh.get_buffer(name).copy_(b)
    with torch.no_grad():
        assert torch.equal(forward(fresh, 1000), forward(model, 1000))
    sharded.close()


def test_shard_frees_the_modules_storage_and_its_grads_live_until_their_hand_over():
    model = make("gpt2")
    before = sum(p.numel() * p.element_size() for p in model.parameters())
    sharded = mp.torch.shard(model, config=case.config_text(recipe="BF16_MASTER"))
    m = sharded.memory()
    # A stand-in of one element per parameter is what is left of the module's storage.
    assert m["module"]["parameters"] <= 4 * len(list(model.parameters())) < before
    for step in range(2):
        loss = forward(model, step)
        assert sharded.memory()["activations"] > 0  # autograd's, until the backward
        loss.backward()
        assert all(p.grad is None for p in model.parameters())  # handed over, then dropped
        assert sharded.memory()["module"]["grads"] == 0
        sharded.step()
    m = sharded.memory()
    planned = sharded.plan()
    assert {c: b for c, b in m["engine"].items() if c not in ("other", "activations")} == \
        {c: planned[c] for c in m["engine"] if c not in ("other", "activations")}
    assert mp.torch.plan(make("gpt2"), config=case.config_text(recipe="BF16_MASTER")) == planned
    assert m["rss"]["peak"] >= m["rss"]["current"] > 0
    sharded.close()


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_inside_the_units_changes_nothing(reentrant):
    model = make("llama")
    reference = copy.deepcopy(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    sharded, ours = shard_losses(model, 5)
    theirs = torch_adamw_losses(reference, 5)
    for r, want in zip(ours, theirs):
        assert abs(r.loss - want) <= 1e-6 * abs(want)
    sharded.close()


def test_mps_own_recomputation_changes_no_bit():
    def run(extra):
        model = make("gpt2")
        sharded = mp.torch.shard(model, config=case.config_text(recipe="BF16_MASTER", extra=extra))
        losses = []
        for s in range(4):
            forward(model, s).backward()
            losses.append(sharded.step().loss)
        recomputed = [sharded.engine.recomputes(u) for u in range(sharded.engine.num_units)]
        weights = sharded.full_state_dict()
        sharded.close()
        return losses, recomputed, weights
    want, none, want_weights = run("")
    got, picked, weights = run("activation_checkpointing { policy: EVERY_UNIT }")
    assert none == [False] * (case.LAYERS + 1)
    assert picked == [False] + [True] * case.LAYERS  # the blocks; never the root
    assert got == want
    for name, w in want_weights.items():
        assert torch.equal(weights[name], w), name


def test_the_lr_set_between_steps_is_used():
    lr_at = {3: case.LR / 4, 6: case.LR * 2}.get
    model = make("gpt2")
    reference = copy.deepcopy(model)
    sharded, ours = shard_losses(model, 8, lr_at=lr_at)
    theirs = torch_adamw_losses(reference, 8, lr_at=lr_at)
    assert [r.lr for r in ours] == pytest.approx([case.LR] * 3 + [case.LR / 4] * 3 + [case.LR * 2] * 2)
    for r, want in zip(ours, theirs):
        assert abs(r.loss - want) <= 1e-6 * abs(want)
    sharded.close()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_bf16_master_ends_within_one_percent_of_autocast(family):
    model = make(family)
    reference = copy.deepcopy(model)
    sharded, ours = shard_losses(model, STEPS, recipe="BF16_MASTER")
    theirs = torch_adamw_losses(reference, STEPS, autocast=True)
    rel = abs(ours[-1].loss - theirs[-1]) / theirs[-1]
    print(f"{family} bf16_master: final loss {ours[-1].loss:.5f}, autocast {theirs[-1]:.5f}, relative {rel:.3g}")
    assert rel <= 0.01
    sharded.close()


def test_the_fp16_recipe_scales_the_loss_as_grad_scaler():
    model = make("gpt2")
    sharded = mp.torch.shard(model, config=case.config_text(recipe="AMP_FP16"))
    scale = sharded.scale(torch.tensor(1.0)).item()
    assert scale > 1, "dynamic loss scaling starts above 1"
    losses = []
    for s in range(8):
        sharded.scale(forward(model, s)).backward()
        r = sharded.step()
        losses.append(r.loss)
        assert r.loss_scale > 1
    assert losses[-1] < losses[0], losses
    sharded.close()


class _TwoBlocks(torch.nn.Module):
    """A module whose root uses a block's weight outside the block."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x @ self.blocks[0].weight


def test_a_parameter_used_outside_its_unit_is_named():
    model = _TwoBlocks()
    sharded = mp.torch.shard(model, config=case.config_text())
    with pytest.raises(mp.ConfigError, match=r"rank 0: parameter 'blocks.0.weight' of unit 0 \('blocks.0'\) used"):
        model(torch.ones(2, 4))
    with torch.no_grad():  # the failed forward left nothing behind: the units still work
        assert model.blocks[1](model.blocks[0](torch.ones(2, 4))).shape == (2, 4)
    sharded.close()


def test_a_checkpoint_resumes_exactly(tmp_path):
    def steps(model, sharded, first, count):
        out = []
        for s in range(first, first + count):
            tokens = case.batch(s)
            model(tokens, labels=tokens).loss.backward()
            out.append(sharded.step().loss)
        return out
    model = make("gpt2")
    sharded = mp.torch.shard(model, config=case.config_text())
    steps(model, sharded, 0, 3)
    sharded.save_checkpoint(str(tmp_path))
    after = steps(model, sharded, 3, 3)
    sharded.close()
    other = make("gpt2", seed=7)  # other weights: the checkpoint replaces them
    resumed = mp.torch.shard(other, config=case.config_text())
    assert resumed.load_checkpoint(str(tmp_path)) == 3
    assert steps(other, resumed, 3, 3) == after
    resumed.close()


def test_order_mistakes_are_named():
    model = make("gpt2")
    sharded = mp.torch.shard(model, config=case.config_text())
    with pytest.raises(mp.ConfigError, match="finish_step without a backward"):
        sharded.step()
    sharded.close()
    model = make("gpt2")
    sharded = mp.torch.shard(model, config=case.config_text(micro_batches=2))
    tokens = case.batch(0)
    model(tokens, labels=tokens).loss.backward()
    with pytest.raises(mp.ConfigError, match=r"unit 0 \('root'\) were reduced 1 times, engine.micro_batches is 2"):
        sharded.step()
    sharded.close()

"""mp.torch on one rank (CTest python_torch): a transformers GPT-2 (2
layers, 64 channels, vocabulary 256) trained through mp equals plain
PyTorch within 1e-6 relative at every one of 20 steps (fp32, deterministic);
its units compute the model's own forward; a checkpoint resumes exactly;
recomputing the blocks' activations changes no bit."""
import copy

import torch

import gpt2_case as case
import mp
import mp.torch

mp.init()
torch.set_num_threads(1)


def test_the_units_compute_the_models_own_loss():
    model = case.make_model()
    tokens = case.batch(0)
    want = mp.torch.causal_lm_loss(model(tokens).logits, tokens)
    x = tokens
    for unit in mp.torch.gpt2_units(model):
        x = unit.forward(x)
    assert torch.equal(mp.torch.causal_lm_loss(x, tokens), want)


def test_twenty_steps_equal_plain_pytorch():
    model = case.make_model()
    reference = copy.deepcopy(model)
    trainer = case.sharded(model)
    ours = [trainer.step() for _ in range(20)]
    theirs = case.torch_losses(reference, 20)
    worst = 0.0
    for s, (r, want) in enumerate(zip(ours, theirs), 1):
        rel = abs(r.loss - want) / abs(want)
        worst = max(worst, rel)
        assert rel <= 1e-6, f"step {s}: mp {r.loss!r}, torch {want!r}, relative difference {rel:.3g}"
    assert ours[-1].loss < ours[0].loss - 0.5, "it did not learn"
    print(f"worst relative loss difference over 20 steps: {worst:.3g}")
    # The module itself gets the trained weights back.
    trainer.sync_module()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-5, msg=name)
    trainer.close()


def test_a_checkpoint_resumes_exactly(tmp_path):
    trainer = case.sharded(case.make_model())
    for _ in range(4):
        trainer.step()
    trainer.save_checkpoint(str(tmp_path))
    after = [trainer.step().loss for _ in range(3)]
    trainer.close()
    resumed = case.sharded(case.make_model(seed=7))  # other initial weights: the checkpoint replaces them
    assert resumed.load_checkpoint(str(tmp_path)) == 4
    assert [resumed.step().loss for _ in range(3)] == after
    resumed.close()


def test_evaluate_runs_forward_only():
    trainer = case.sharded(case.make_model())
    before = trainer.engine.gather_master(0)
    loss = trainer.evaluate(first=0, count=2)
    model = case.make_model()
    with torch.no_grad():
        want = sum(mp.torch.causal_lm_loss(model(case.batch(i)).logits, case.batch(i)).item() for i in (0, 1)) / 2
    assert abs(loss - want) <= 1e-6 * want
    assert (trainer.engine.gather_master(0) == before).all()
    trainer.close()


def test_recomputing_the_blocks_changes_no_bit():
    plain = case.sharded(case.make_model(), recipe="BF16_MASTER")
    want = [plain.step().loss for _ in range(4)]
    want_weights = [plain.engine.gather_master(u) for u in range(plain.engine.num_units)]
    plain.close()
    trainer = case.sharded(case.make_model(), recipe="BF16_MASTER",
                           extra="activation_checkpointing { policy: EVERY_UNIT }")
    # the blocks; not the embedding (it owns the tied wte) nor the head (last, and tied)
    assert trainer._recomputed == [False] + [True] * case.LAYERS + [False]
    calls = []
    recompute = trainer.recompute
    trainer.recompute = lambda unit, params, stream=None: (calls.append(unit), recompute(unit, params, stream))
    got = [trainer.step().loss for _ in range(4)]
    assert got == want
    assert calls == list(range(case.LAYERS, 0, -1)) * 4
    for u in range(trainer.engine.num_units):
        assert (trainer.engine.gather_master(u) == want_weights[u]).all(), f"unit {u}"
    trainer.close()

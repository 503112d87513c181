"""mp's Python bindings on one rank (CTest python_engine, under launch/mprun):
the module, a model written in numpy against the engine (zero-copy arrays,
the loss falls to the teacher's), weights in and out, memory, checkpoints
resumed exactly, and every error path: a bad config, bad arguments, a
callback that raises, one that writes the wrong shape, one that returns
the wrong type."""
import os

import numpy as np
import pytest

import mp

mp.init()

N_IN, BATCH = 4, 16
TEACHER_W = np.array([0.5, -1.0, 2.0, 0.25], dtype=np.float32)
TEACHER_B = 0.75
FP32 = "precision { recipe: RECIPE_FP32 } optimizer { lr: 0.1 weight_decay: 0 } deterministic: true"


def units():
    return [mp.Unit("linear", [mp.Param("linear.weight", [N_IN], init="normal", scale=0.02),
                               mp.Param("linear.bias", [1], init="zeros")])]


class Regression:
    """y = x . w + b against a fixed teacher, in numpy on the arrays mp gives."""

    def __init__(self, engine):
        self.w_at = engine.param_location("linear.weight")[1]
        self.b_at = engine.param_location("linear.bias")[1]
        self.seen = []

    def begin_micro_batch(self, index):
        rng = np.random.default_rng(index)
        self.x = rng.standard_normal((BATCH, N_IN)).astype(np.float32)
        self.y = self.x @ TEACHER_W + TEACHER_B

    def forward(self, unit, params):
        p = np.asarray(params)
        self.seen.append((params, p.dtype, p.shape))
        w, b = p[self.w_at:self.w_at + N_IN], p[self.b_at]
        self.err = self.x @ w + b - self.y

    def loss(self):
        return float(np.mean(self.err ** 2))

    def backward(self, unit, params, grads):
        g = np.asarray(grads)  # zero-copy: written in place
        d = 2.0 * self.err / BATCH
        g[self.w_at:self.w_at + N_IN] = self.x.T @ d
        g[self.b_at] = d.sum()


def test_version_and_world():
    assert mp.version() == mp.__version__
    assert [int(v) for v in mp.version().split(".")] >= [0, 1, 0]
    mp.init()  # a second call does nothing
    assert mp.initialized() and mp.rank() == 0 and mp.world_size() == 1


def test_a_numpy_model_trains_on_zero_copy_arrays():
    engine = mp.Engine(units(), FP32)
    assert engine.num_units == 1 and engine.param_dtype == "float32" and engine.device == "cpu"
    model = Regression(engine)
    first = engine.step(model).loss
    for _ in range(60):
        last = engine.step(model)
    assert last.step == 61 and not last.skipped
    assert last.loss < first / 100, (first, last.loss)
    _, dtype, shape = model.seen[0]
    assert dtype == np.float32 and shape[0] >= engine.unit_numel(0)
    w = engine.gather_master(0)
    np.testing.assert_allclose(w[model.w_at:model.w_at + N_IN], TEACHER_W, atol=0.05)
    engine.close()


def test_weights_in_and_out_and_memory():
    engine = mp.Engine(units(), FP32)
    n = engine.unit_numel(0)
    values = np.arange(n, dtype=np.float32) / 8
    engine.set_weights(0, values, root=0)
    np.testing.assert_array_equal(engine.gather_master(0), values)
    assert [p["name"] for p in engine.params(0)] == ["linear.weight", "linear.bias"]
    m = engine.memory()
    assert m["current"]["master"] > 0 and m["total_current"] >= m["current"]["master"]
    assert set(m["peak"]) == set(m["current"])
    engine.close()


def test_checkpoints_resume_exactly(tmp_path):
    engine = mp.Engine(units(), FP32)
    model = Regression(engine)
    for _ in range(3):
        engine.step(model)
    path = engine.save_checkpoint(str(tmp_path / "ckpt"))
    assert os.path.basename(path) == "step_00000003"
    after = [engine.step(model).loss for _ in range(3)]
    engine.close()

    resumed = mp.Engine(units(), FP32)
    assert resumed.load_checkpoint(str(tmp_path / "ckpt")) == 3  # the root: its latest, step 3
    again = [resumed.step(Regression(resumed)) for _ in range(3)]
    assert [r.loss for r in again] == after  # bit for bit
    assert again[0].step == 4
    resumed.close()


def test_a_param_marked_for_muon():
    assert not mp.Param("w", [4]).muon and mp.Param("w", [1, 4], muon=True).muon
    assert mp.optimizer_kind("") == "ADAMW" and mp.optimizer_kind("optimizer { kind: MUON }") == "MUON"
    assert mp.optimizer_updates_matrices("optimizer { kind: MUON }")
    assert not mp.optimizer_updates_matrices("optimizer { kind: SGD momentum: 0.9 }")
    config = ("precision { recipe: RECIPE_FP32 } deterministic: true "
              "optimizer { kind: MUON lr: 0.05 weight_decay: 0 muon { adamw_lr: 0.1 } }")

    def run(marked):
        engine = mp.Engine([mp.Unit("linear", [mp.Param("linear.weight", [1, N_IN], muon=marked),
                                               mp.Param("linear.bias", [1], init="zeros")])], config)
        assert [d["muon"] for d in engine.params(0)] == [marked, False]
        model = Regression(engine)
        losses = [engine.step(model).loss for _ in range(20)]
        weights = engine.gather_master(0)
        engine.close()
        return losses, weights
    (adamw, w_adamw), (muon, w_muon) = run(False), run(True)
    # The same start; the marked matrix then moves by Muon's updates, not AdamW's.
    assert muon[0] == adamw[0] and muon[-1] < muon[0] / 2 and not np.array_equal(w_muon, w_adamw)
    with pytest.raises(mp.ConfigError, match=r"parameter 'linear.weight' of shape \[4\] is marked for Muon"):
        mp.Engine([mp.Unit("linear", [mp.Param("linear.weight", [N_IN], muon=True)])], config)


def test_a_bad_config_is_a_config_error_naming_line_and_column():
    with pytest.raises(mp.ConfigError) as e:
        mp.Engine(units(), "optimizer {\n  lr: -bogus\n}")
    assert e.value.tier == "ConfigError" and isinstance(e.value, mp.Error)
    assert "engine config:2:" in str(e.value), str(e.value)
    assert e.value.rank == 0 and e.value.file and e.value.line > 0
    with pytest.raises(mp.ConfigError, match="beta2"):
        mp.Engine(units(), "optimizer { beta2: 1.5 }")
    with pytest.raises(mp.ConfigError, match="expected 'cpu'"):
        mp.Engine(units(), FP32, device="tpu")
    with pytest.raises(mp.ConfigError, match="init 'gaussian'"):
        mp.Param("w", [2], init="gaussian")


def test_bad_arguments_name_what_is_wrong():
    engine = mp.Engine(units(), FP32)
    with pytest.raises(mp.ConfigError, match="unit 3 out of range"):
        engine.gather_master(3)
    with pytest.raises(mp.ConfigError, match=f"has {engine.unit_numel(0)} elements, got 2"):
        engine.set_weights(0, np.zeros(2, dtype=np.float32))
    with pytest.raises(mp.ConfigError, match="linear.nope"):
        engine.param_location("linear.nope")
    engine.close()
    with pytest.raises(mp.ConfigError, match="closed"):
        engine.step(Regression)


class Raising(Regression):
    def backward(self, unit, params, grads):
        raise ValueError("boom in backward")


class WrongShape(Regression):
    def backward(self, unit, params, grads):
        np.asarray(grads)[:] = np.ones(3, dtype=np.float32)  # 3 values into the unit's buffer


class WrongType(Regression):
    def loss(self):
        return "not a number"


@pytest.mark.parametrize("model, want", [
    (Raising, "the model's backward of unit 0 ('linear') raised:"),
    (WrongShape, "the model's backward of unit 0 ('linear') raised:"),
    (WrongType, "the model's loss returned a value of the wrong type"),
])
def test_a_failing_callback_fails_the_step_with_its_traceback(model, want):
    engine = mp.Engine(units(), FP32)
    engine.step(Regression(engine))
    with pytest.raises(mp.ModelError) as e:
        engine.step(model(engine))
    text = str(e.value)
    assert want in text, text
    assert e.value.agreed and e.value.tier == "ModelError"
    if model is Raising:
        assert "ValueError: boom in backward" in text and "test_engine.py" in text, text
    if model is WrongShape:
        assert "could not broadcast" in text, text
    # The engine's compute stream stays failed: every later call says so.
    with pytest.raises(mp.ModelError):
        engine.step(Regression(engine))
    engine.close()

#!/usr/bin/env python3
"""examples/ctypes_train.py: mp's C ABI from Python, with ctypes only.

    python3 examples/ctypes_train.py build/libmp_c.so [STEPS]

Linear regression (y = x . w + b against a fixed teacher) whose forward and
backward are Python callbacks; mp owns the weights, the optimizer and the
sharding (world size 1 here; under mpirun every rank runs this script).
Exits 0 when the loss falls 100x and a bad config gives MP_ERROR_CONFIG
with a message naming the line and column.
"""
import ctypes as C
import random
import struct
import sys

MP_OK, MP_ERROR_CONFIG = 0, 1
MP_INIT_ZEROS, MP_INIT_NORMAL = 0, 2
MP_DTYPE_F32, MP_DTYPE_BF16 = 0, 1


class ParamDesc(C.Structure):
    _fields_ = [("name", C.c_char_p), ("ndim", C.c_int), ("shape", C.POINTER(C.c_int64)),
                ("init", C.c_int), ("init_scale", C.c_double), ("muon", C.c_int)]


class UnitDesc(C.Structure):
    _fields_ = [("name", C.c_char_p), ("num_params", C.c_int), ("params", C.POINTER(ParamDesc)),
                ("recomputable", C.c_int)]


BEGIN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int64)
FORWARD = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.c_void_p, C.c_int, C.c_int64)
LOSS = C.CFUNCTYPE(C.c_double, C.c_void_p)
BACKWARD = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.c_void_p, C.c_int, C.POINTER(C.c_float), C.c_int64)


class Callbacks(C.Structure):
    _fields_ = [("begin_micro_batch", BEGIN), ("forward", FORWARD), ("loss", LOSS), ("backward", BACKWARD),
                ("recompute", FORWARD)]  # NULL: no unit is recomputed


class StepResult(C.Structure):
    _fields_ = [("step", C.c_int64), ("loss", C.c_double), ("grad_norm", C.c_double), ("loss_scale", C.c_double),
                ("lr", C.c_double), ("skipped", C.c_int), ("seconds", C.c_double)]


def main():
    lib = C.CDLL(sys.argv[1], mode=C.RTLD_GLOBAL)  # MPI's plugins need its symbols global
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    lib.mp_version.restype = C.c_char_p
    lib.mp_last_error.restype = C.c_char_p
    lib.mp_engine_last_error.restype = C.c_char_p
    lib.mp_engine_create.argtypes = [C.c_char_p, C.POINTER(UnitDesc), C.c_int, C.POINTER(C.c_void_p)]
    lib.mp_engine_param_location.argtypes = [C.c_void_p, C.c_char_p, C.POINTER(C.c_int), C.POINTER(C.c_int64),
                                             C.POINTER(C.c_int64)]
    lib.mp_engine_step.argtypes = [C.c_void_p, C.POINTER(Callbacks), C.c_void_p, C.POINTER(StepResult)]
    lib.mp_engine_last_error.argtypes = [C.c_void_p]
    lib.mp_engine_destroy.argtypes = [C.c_void_p]
    lib.mp_engine_num_units.argtypes = [C.c_void_p]
    lib.mp_engine_unit_numel.argtypes = [C.c_void_p, C.c_int]
    lib.mp_engine_unit_numel.restype = C.c_int64
    lib.mp_engine_set_weights.argtypes = [C.c_void_p, C.c_int, C.POINTER(C.c_float), C.c_int64]
    lib.mp_engine_get_weights.argtypes = [C.c_void_p, C.c_int, C.POINTER(C.c_float), C.c_int64]
    if lib.mp_init(None, None) != MP_OK:
        sys.exit("mp_init: " + lib.mp_last_error().decode())

    n_in, batch = 4, 16
    w_shape, b_shape = (C.c_int64 * 1)(n_in), (C.c_int64 * 1)(1)
    params = (ParamDesc * 2)(ParamDesc(b"linear.weight", 1, w_shape, MP_INIT_NORMAL, 0.02),
                             ParamDesc(b"linear.bias", 1, b_shape, MP_INIT_ZEROS, 0.0))
    unit = UnitDesc(b"linear", 2, params)
    config = b"sharding { strategy: FULL_SHARD } precision { recipe: RECIPE_FP32 } optimizer { lr: 0.1 }"
    engine = C.c_void_p()
    if lib.mp_engine_create(config, C.byref(unit), 1, C.byref(engine)) != MP_OK:
        sys.exit("mp_engine_create: " + lib.mp_last_error().decode())
    where = {}
    for name in (b"linear.weight", b"linear.bias"):
        u, off, n = C.c_int(), C.c_int64(), C.c_int64()
        assert lib.mp_engine_param_location(engine, name, C.byref(u), C.byref(off), C.byref(n)) == MP_OK
        where[name] = off.value

    teacher, bias = [1.0, -2.0, 3.0, -4.0], 0.5
    state = {}

    def read(params, dtype, i):
        if dtype == MP_DTYPE_F32:
            return C.cast(params, C.POINTER(C.c_float))[i]
        bits = C.cast(params, C.POINTER(C.c_uint16))[i]
        return struct.unpack("<f", struct.pack("<I", bits << 16))[0]

    def begin(_, g):
        rng = random.Random(g)
        state["x"] = [[rng.uniform(-1, 1) for _ in range(n_in)] for _ in range(batch)]
        state["y"] = [sum(t * v for t, v in zip(teacher, row)) + bias for row in state["x"]]
        return 0

    def forward(_, unit_index, params, dtype, numel):
        w = [read(params, dtype, where[b"linear.weight"] + j) for j in range(n_in)]
        b = read(params, dtype, where[b"linear.bias"])
        state["pred"] = [sum(wj * v for wj, v in zip(w, row)) + b for row in state["x"]]
        state["loss"] = sum(0.5 * (p - y) ** 2 for p, y in zip(state["pred"], state["y"])) / batch
        return 0

    def loss(_):
        return state["loss"]

    def backward(_, unit_index, params, dtype, grads, numel):
        gw, gb = [0.0] * n_in, 0.0
        for row, p, y in zip(state["x"], state["pred"], state["y"]):
            d = (p - y) / batch
            gw = [g + d * v for g, v in zip(gw, row)]
            gb += d
        for j in range(n_in):
            grads[where[b"linear.weight"] + j] = gw[j]
        grads[where[b"linear.bias"]] = gb
        return 0

    callbacks = Callbacks(BEGIN(begin), FORWARD(forward), LOSS(loss), BACKWARD(backward))
    result = StepResult()
    losses = []
    for _ in range(steps):
        if lib.mp_engine_step(engine, C.byref(callbacks), None, C.byref(result)) != MP_OK:
            sys.exit("mp_engine_step: " + lib.mp_engine_last_error(engine).decode())
        losses.append(result.loss)

    # The unit's weights in and out: the teacher's, set, read back, and a
    # step from them has (nearly) no loss.
    assert lib.mp_engine_num_units(engine) == 1
    n = lib.mp_engine_unit_numel(engine, 0)
    values = (C.c_float * n)()
    for j in range(n_in):
        values[where[b"linear.weight"] + j] = teacher[j]
    values[where[b"linear.bias"]] = bias
    back = (C.c_float * n)()
    weights_ok = (lib.mp_engine_set_weights(engine, 0, values, n) == MP_OK and
                  lib.mp_engine_get_weights(engine, 0, back, n) == MP_OK and list(back) == list(values) and
                  lib.mp_engine_step(engine, C.byref(callbacks), None, C.byref(result)) == MP_OK and
                  result.loss < 1e-6)
    lib.mp_engine_destroy(engine)

    bad = C.c_void_p()
    status = lib.mp_engine_create(b"optimizer { lr: }", C.byref(unit), 1, C.byref(bad))
    message = lib.mp_last_error().decode()
    ok_error = status == MP_ERROR_CONFIG and "engine config:1:" in message
    lib.mp_finalize()

    fell = losses[-1] < losses[0] / 100
    print(f"mp {lib.mp_version().decode()} from Python ctypes: loss {losses[0]:.4f} -> {losses[-1]:.3g} "
          f"in {steps} steps; bad config -> status {status}: {message.splitlines()[0]}")
    print(f"set_weights/get_weights round trip and a step from the teacher's weights: "
          f"{'loss ' + format(result.loss, '.3g') if weights_ok else 'FAILED'}")
    print("PASS" if fell and ok_error and weights_ok else "FAILED")
    sys.exit(0 if fell and ok_error and weights_ok else 1)


if __name__ == "__main__":
    main()

"""The hand-written bad inputs to mp_worker (test_bad_inputs.py runs them):
each case's files, its command line, its exit code and its exact message,
DIR standing for the scratch directory. docs/reliability.md ("Bad input")
shows every message;

    python3 tests/worker/bad_inputs.py

prints the cases as that Markdown table, without running them.
"""
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MLP = [str(ROOT / "configs" / "mlp.textproto"), "--steps", "2"]
GPT = ["--set", "model.gpt.layers=1", "--set", "model.gpt.context=16", "--set", "model.gpt.channels=32",
       "--set", "model.gpt.heads=2", "--set", "val_interval=0", "--steps", "1"]
CHECKPOINT = "step_00000002"  # what MLP's two steps with save_at_end leave in DIR/run/checkpoints
NO_DEVICE = {"CUDA_VISIBLE_DEVICES": ""}  # so the device cases hold on GPU machines too


@dataclass
class Case:
    what: str
    exit: int
    message: str
    args: object  # args(DIR) -> the worker's arguments
    files: object = None  # files(DIR): writes what the case reads
    env: dict = field(default_factory=dict)
    checkpoint: bool = False  # reads DIR/run/checkpoints, the checkpoint MLP saved


def text(name, content):
    return lambda d: (d / name).write_bytes(content)


def tokens(name, count, magic=20240520, toks=None):
    """An llm.c token file: 256 int32 header (magic, version 1, count), uint16 tokens."""
    toks = list(range(1, 65)) if toks is None else toks
    header = [magic, 1, count] + [0] * 253
    return text(name, struct.pack("<256i", *header) + struct.pack(f"<{len(toks)}H", *toks))


def checkpoint_copy(name, damage=None):
    """DIR/name: a copy of DIR/run/checkpoints, then damage(DIR/name/step_00000002)."""
    def make(d):
        shutil.rmtree(d / name, ignore_errors=True)
        shutil.copytree(d / "run" / "checkpoints", d / name)
        if damage:
            damage(d / name / CHECKPOINT)
    return make


def flip_middle_byte(path):
    b = bytearray(path.read_bytes()) or bytearray(1)
    b[len(b) // 2] ^= 1
    path.write_bytes(b)


def flip_last_byte(path):
    b = bytearray(path.read_bytes()) or bytearray(1)
    b[-1] ^= 1
    path.write_bytes(b)


def cut_100_bytes(path):
    path.write_bytes(path.read_bytes()[:-100])


def sets(*assignments):
    return [w for a in assignments for w in ("--set", a)]


CASES = [
    # ---- config files and --set ----
    Case("empty config file", 2,
         "model is not set: the config needs model { gpt { ... } } or model { mlp { ... } }",
         lambda d: [d / "empty.textproto"], text("empty.textproto", b"")),
    Case("syntax error", 2, "DIR/syntax.textproto:1:23: Expected integer, got: }",
         lambda d: [d / "syntax.textproto"], text("syntax.textproto", b"model { gpt { layers: } }\n")),
    Case("misspelled field", 2,
         'DIR/unknown.textproto:2:18: Message type "mp.proto.DataConfig" has no field named "micro_batchsize".',
         lambda d: [d / "unknown.textproto"], text("unknown.textproto", b"data {\n  micro_batchsize: 4\n}\n")),
    Case("a string that is not UTF-8", 2,
         "DIR/utf8.textproto:2:3: data.train_path: not valid UTF-8 (text fields are UTF-8)",
         lambda d: [d / "utf8.textproto"], text("utf8.textproto", b'data {\n  train_path: "a\\xff.bin"\n}\n')),
    Case("missing config file", 2, "train config 'DIR/none.textproto': cannot open: No such file or directory",
         lambda d: [d / "none.textproto"]),
    Case("negative count", 2, "steps = -5: must be positive", lambda d: sets("steps=-5")),
    Case("huge size", 2, "model.gpt.layers = 99999999999: must be at most 65536",
         lambda d: sets("model.gpt.layers=99999999999")),
    Case("zero batch", 2, "data.micro_batch_size = 0: must be positive", lambda d: sets("data.micro_batch_size=0")),
    Case("wrong type", 2, "engine.optimizer.lr = 'fast': not a number", lambda d: sets("engine.optimizer.lr=fast")),
    Case("infinite value", 2, "engine.optimizer.lr = 'inf': not a finite number",
         lambda d: sets("engine.optimizer.lr=inf")),
    Case("unknown enum value", 2,
         "engine.precision.recipe = 'fp64': not a value of mp.proto.PrecisionPolicy.Recipe; valid: RECIPE_UNSET, "
         "RECIPE_FP32,", lambda d: sets("engine.precision.recipe=fp64")),
    Case("unknown field in --set", 2,
         "unknown field 'engine.optimizer.learning_rate': engine.optimizer (mp.proto.OptimizerConfig) has kind, lr, "
         "beta1,", lambda d: sets("engine.optimizer.learning_rate=1e-3")),
    Case("--set without =", 2, "override 'steps': missing '=' (write field.path=value, e.g. engine.optimizer.lr=3e-4)",
         lambda d: ["--set", "steps"]),
    Case("heads do not divide channels", 2, "model.gpt.heads = 3 does not divide model.gpt.channels = 100",
         lambda d: sets("model.gpt.channels=100", "model.gpt.heads=3")),
    Case("recomputation every 1st unit", 2,
         "activation_checkpointing.every = 1: EVERY_KTH_UNIT needs k >= 2 (EVERY_UNIT is k = 1)",
         lambda d: GPT + sets("engine.activation_checkpointing.policy=EVERY_KTH_UNIT",
                              "engine.activation_checkpointing.every=1")),
    Case("recomputation of a model that cannot", 2,
         "activation_checkpointing is on, but the model can recompute none of its 4 units (UnitSpec::recomputable)",
         lambda d: MLP + sets("engine.activation_checkpointing.policy=EVERY_UNIT")),
    Case("bad fp32_ops regex", 2,
         "compute.fp32_ops[0] = 'h(0': not a valid ECMAScript regex (Mismatched '(' and ')' in regular expression)",
         lambda d: sets("compute.fp32_ops=h(0")),
    # ---- token files ----
    Case("empty token file", 2,
         "token file 'DIR/empty.bin': 0 bytes, shorter than the 1024-byte header of an llm.c token file",
         lambda d: GPT + sets(f"data.train_path={d / 'empty.bin'}"), text("empty.bin", b"")),
    Case("not a token file (magic)", 2,
         "token file 'DIR/magic.bin': magic 12345, expected 20240520 (not an llm.c token file)",
         lambda d: GPT + sets(f"data.train_path={d / 'magic.bin'}"), tokens("magic.bin", 64, magic=12345)),
    Case("truncated token file", 2,
         "token file 'DIR/short.bin': the header says 1000 tokens (3024 bytes in all) but the file has 1152 bytes "
         "(truncated)", lambda d: GPT + sets(f"data.train_path={d / 'short.bin'}"), tokens("short.bin", 1000)),
    Case("negative token count", 2, "token file 'DIR/negative.bin': negative token count -1",
         lambda d: GPT + sets(f"data.train_path={d / 'negative.bin'}"), tokens("negative.bin", -1)),
    Case("token id out of range", 2,
         "token file 'DIR/vocab.bin': token 60000 at position 63 is not below the vocabulary size 256",
         lambda d: GPT + sets(f"data.train_path={d / 'vocab.bin'}"),
         tokens("vocab.bin", 64, toks=list(range(1, 64)) + [60000])),
    Case("missing token file", 1, "token file 'DIR/none.bin': cannot open: No such file or directory",
         lambda d: GPT + sets(f"data.train_path={d / 'none.bin'}")),
    # ---- checkpoints ----
    Case("--resume of a missing path", 1,
         "checkpoint 'DIR/nothing': neither a checkpoint (manifest.pb) nor a checkpoint root (latest)",
         lambda d: MLP + ["--resume", d / "nothing"], checkpoint=True),
    Case("a flipped byte in a shard", 2,
         "checkpoint file 'DIR/flipped/step_00000002/shard_00000.bin': checksum mismatch in bytes "
         "[1048576, 2097152) (block 1): the data is corrupt", lambda d: MLP + ["--resume", d / "flipped"],
         checkpoint_copy("flipped", lambda c: flip_middle_byte(c / "shard_00000.bin")), checkpoint=True),
    Case("truncated shard", 2,
         "checkpoint file 'DIR/truncated/step_00000002/shard_00000.bin': 2132700 bytes, the manifest says 2132800 "
         "(truncated)", lambda d: MLP + ["--resume", d / "truncated"],
         checkpoint_copy("truncated", lambda c: cut_100_bytes(c / "shard_00000.bin")), checkpoint=True),
    Case("edited manifest", 2,
         "checkpoint manifest 'DIR/edited/step_00000002/manifest.pb': checksum mismatch (the manifest was edited or "
         "is corrupt)", lambda d: MLP + ["--resume", d / "edited"],
         checkpoint_copy("edited", lambda c: flip_last_byte(c / "manifest.pb")), checkpoint=True),
    Case("latest names no checkpoint", 2,
         "checkpoint pointer 'DIR/pointer/latest': '../../etc' is not a checkpoint directory name",
         lambda d: MLP + ["--resume", d / "pointer"],
         checkpoint_copy("pointer", lambda c: (c.parent / "latest").write_text("../../etc\n")), checkpoint=True),
    Case("checkpoint of another model", 2,
         "checkpoint 'DIR/run/checkpoints/step_00000002' has 4 units, the model has 2",
         lambda d: MLP + sets("model.mlp.dims=64,256,16") + ["--resume", d / "run" / "checkpoints"], checkpoint=True),
    Case("checkpoint of another precision", 2, "load with the checkpoint's precision settings",
         lambda d: MLP + sets("engine.precision.recipe=recipe_fp32") + ["--resume", d / "run" / "checkpoints"],
         checkpoint=True),
    # ---- devices and environment variables (no device visible) ----
    Case("compute.device CUDA without a GPU", 2, "rank 0: compute.device = CUDA, but",
         lambda d: GPT + sets("compute.device=CUDA"), env=NO_DEVICE),
    Case("MP_FAULT device_fault on the CPU", 2,
         "MP_FAULT device_fault needs a CUDA engine; this one computes on the CPU",
         lambda d: GPT, env={**NO_DEVICE, "MP_FAULT": "device_fault@1:0"}),
    Case("MP_CUDA_SYNC neither 0 nor 1", 2, "MP_CUDA_SYNC = '2': use 1 (synchronise after every CUDA op) or 0",
         lambda d: GPT, env={**NO_DEVICE, "MP_CUDA_SYNC": "2"}),
    Case("MP_OP_PROFILE neither 0 nor 1", 2, "MP_OP_PROFILE = 'yes': use 1 (print the compute time by op family) or 0",
         lambda d: GPT, env={**NO_DEVICE, "MP_OP_PROFILE": "yes"}),
]


def markdown_table():
    rows = ["| bad input | exit | message |", "|---|---|---|"]
    rows += [f"| {c.what} | {c.exit} | `{c.message}` |" for c in CASES]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())

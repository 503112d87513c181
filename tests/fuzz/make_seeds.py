#!/usr/bin/env python3
"""tests/fuzz/make_seeds.py BUILD_DIR [--corpus DIR]: (re)writes the seed
corpora (tests/fuzz/corpus/, or DIR) from real files: checkpoints mp_worker
saves (a small MLP on 1 and 2 ranks, three precision recipes), token files,
safetensors files, the configs in configs/ and override lists.
Deterministic apart from the checkpoints' creation time. Run it when a
format changes; commit the result.
"""
import argparse
import json
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ["recipe_fp32", "bf16_master", "pure_bf16"]


def checkpoints(build, out):
    """fuzz_checkpoint.cc's layout: a flags byte, the manifest's length and
    bytes, then the shard files (with 2 ranks, the first one's length too).
    -raw: the files as saved; -fixed: the manifest's payload alone, flags 3
    (the harness fixes the checksums)."""
    small = [str(ROOT / "configs" / "mlp.textproto"), "--set", "model.mlp.dims=6,8,3", "--steps", "2",
             "--set", "log_interval=1", "--set", "checkpoint.save_at_end=true"]
    with tempfile.TemporaryDirectory() as work:
        for recipe in RECIPES:
            for np in (1, 2):
                run_dir = Path(work) / f"{recipe}-{np}"
                done = subprocess.run([str(ROOT / "launch" / "mprun"), "-np", str(np), "--bind-to", "none",
                                       str(build / "mp_worker"), *small, "--set", f"engine.precision.recipe={recipe}",
                                       "--out", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                if done.returncode != 0:
                    sys.exit(done.stdout.decode(errors="replace"))
                ckpt = sorted((run_dir / "checkpoints").glob("step_*"))[0]
                manifest = (ckpt / "manifest.pb").read_bytes()
                shards = [(ckpt / f"shard_{r:05d}.bin").read_bytes() for r in range(np)]
                two = 4 if np == 2 else 0

                def pack(flags, man):
                    b = bytes([flags]) + struct.pack("<I", len(man)) + man
                    if flags & 4:
                        return b + struct.pack("<I", len(shards[0])) + shards[0] + shards[1]
                    return b + shards[0]

                (out / f"{recipe}-np{np}-raw").write_bytes(pack(two, manifest))
                (out / f"{recipe}-np{np}-fixed").write_bytes(pack(two | 3, manifest[32:]))


def token_files(out):
    """The llm.c layout: 256 int32 header (magic, version, count), uint16 tokens."""
    def tokens(name, toks, count=None, magic=20240520, version=1, extra=b""):
        header = [magic, version, len(toks) if count is None else count] + [0] * 253
        (out / name).write_bytes(struct.pack("<256i", *header) + struct.pack(f"<{len(toks)}H", *toks) + extra)

    tokens("valid-16", list(range(100, 116)))
    tokens("valid-empty", [])
    tokens("vocab-edge", [0, 50256, 50257, 65535])
    tokens("count-mismatch", [1, 2, 3], count=5)
    tokens("bad-version", [1, 2], version=2)


def safetensors(out):
    """Whole files, valid and not."""
    def st(name, tensors, metadata=None, header=None, tail=b""):
        h, data = {}, b""
        for tname, dtype, shape, raw in tensors:
            h[tname] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        if metadata is not None:
            h["__metadata__"] = metadata
        text = (header if header is not None else json.dumps(h)).encode()
        (out / name).write_bytes(struct.pack("<Q", len(text)) + text + data + tail)

    f32 = struct.pack("<4f", 1.0, -2.5, 0.0, 3.25)
    bf16 = struct.pack("<3H", 0x3F80, 0xC000, 0x7FC0)
    f16 = struct.pack("<2H", 0x3C00, 0x7E00)
    st("valid-three-dtypes", [("a", "F32", [2, 2], f32), ("b", "BF16", [3], bf16), ("c", "F16", [2], f16)],
       metadata={"format": "pt"})
    st("valid-scalar-and-empty", [("s", "F32", [], struct.pack("<f", 7.0)), ("e", "F32", [0], b"")])
    st("valid-int", [("i", "I64", [2], struct.pack("<2q", -1, 1 << 40))])
    st("bad-offsets", [("a", "F32", [4], f32)],
       header=json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}))
    st("bad-json", [], header='{"a": {"dtype": "F32"')
    st("trailing-bytes", [("a", "F32", [4], f32)], tail=b"xx")


def train_configs(out):
    """The configs as text, then NUL-separated overrides."""
    configs = ROOT / "configs"
    for name in ("default", "mlp", "gpt2_124m"):
        shutil.copyfile(configs / f"{name}.textproto", out / name)

    def overrides(name, config, *sets):
        text = (configs / f"{config}.textproto").read_text().rstrip("\n")  # as "$(cat FILE)" gives it
        (out / name).write_text("\0".join([text, *sets]))

    overrides("mlp-overrides", "mlp", "model.mlp.dims=4,8,2", "engine.sharding.strategy=shard_grad_op",
              "engine.optimizer.lr=1e-3")
    overrides("default-overrides", "default", "model.gpt.layers=2", "compute.fp32_ops=head,h0\\..*",
              "checkpoint.interval_steps=10", "engine.precision.recipe=AMP_FP16")
    (out / "bad-micro-batches").write_text("model { gpt { layers: 2 } } engine { micro_batches: 0 }")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", type=Path, help="the build directory (its mp_worker saves the checkpoints)")
    parser.add_argument("--corpus", type=Path, default=ROOT / "tests" / "fuzz" / "corpus")
    a = parser.parse_args()
    corpus = a.corpus.resolve()
    for kind, write in (("checkpoint", lambda out: checkpoints(a.build.resolve(), out)), ("token_file", token_files),
                        ("safetensors", safetensors), ("train_config", train_configs)):
        (corpus / kind).mkdir(parents=True, exist_ok=True)
        write(corpus / kind)
        for f in sorted((corpus / kind).iterdir()):
            print(f"{f.stat().st_size:10d}  {kind}/{f.name}")


if __name__ == "__main__":
    main()

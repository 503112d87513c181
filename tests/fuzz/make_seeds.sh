#!/usr/bin/env bash
# tests/fuzz/make_seeds.sh BUILD_DIR: (re)writes the seed corpora in
# tests/fuzz/corpus/ from real files: checkpoints mp_worker saves (a small
# MLP on 1 and 2 ranks, three precision recipes), token files, the configs
# in configs/ and override lists. Deterministic apart from the checkpoint's
# creation time. Run it when a format changes; commit the result.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: make_seeds.sh BUILD_DIR}" && pwd)
corpus=$root/tests/fuzz/corpus
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$corpus"/{checkpoint,safetensors,token_file,train_config}

# ---- checkpoints: fuzz_checkpoint.cc's layout -------------------------------------
small=("$root/configs/mlp.textproto" --set model.mlp.dims=6,8,3 --steps 2 --set log_interval=1
       --set checkpoint.save_at_end=true)
for recipe in recipe_fp32 bf16_master pure_bf16; do
  for np in 1 2; do
    "$root/launch/mprun" -np $np --bind-to none "$build/mp_worker" "${small[@]}" \
      --set engine.precision.recipe=$recipe --out "$work/$recipe-$np" > "$work/$recipe-$np.log" 2>&1 ||
      { cat "$work/$recipe-$np.log"; exit 1; }
    ckpt=$(ls -d "$work/$recipe-$np"/checkpoints/step_* | head -1)
    python3 - "$ckpt" "$np" "$corpus/checkpoint/$recipe-np$np" <<'PY'
import struct, sys
ckpt, np, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
manifest = open(ckpt + "/manifest.pb", "rb").read()
shards = [open(f"{ckpt}/shard_{r:05d}.bin", "rb").read() for r in range(np)]
def pack(flags, man):
    b = bytes([flags]) + struct.pack("<I", len(man)) + man
    if flags & 4:
        return b + struct.pack("<I", len(shards[0])) + shards[0] + shards[1]
    return b + shards[0]
two = 4 if np == 2 else 0
open(out + "-raw", "wb").write(pack(two, manifest))          # the files as saved
open(out + "-fixed", "wb").write(pack(two | 3, manifest[32:]))  # payload; the harness fixes checksums
PY
  done
done

# ---- token files (llm.c layout: 256 int32 header, uint16 tokens) ---------------------
python3 - "$corpus/token_file" <<'PY'
import struct, sys
out = sys.argv[1]
def tokens(name, toks, count=None, magic=20240520, version=1, extra=b""):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(toks) if count is None else count
    open(f"{out}/{name}", "wb").write(struct.pack("<256i", *header) + struct.pack(f"<{len(toks)}H", *toks) + extra)
tokens("valid-16", list(range(100, 116)))
tokens("valid-empty", [])
tokens("vocab-edge", [0, 50256, 50257, 65535])
tokens("count-mismatch", [1, 2, 3], count=5)
tokens("bad-version", [1, 2], version=2)
PY

# ---- safetensors: whole files, valid and not ----------------------------------------
python3 - "$corpus/safetensors" <<'PY'
import json, struct, sys
out = sys.argv[1]
def st(name, tensors, metadata=None, header=None, tail=b""):
    h, data = {}, b""
    for tname, dtype, shape, raw in tensors:
        h[tname] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        h["__metadata__"] = metadata
    text = (header if header is not None else json.dumps(h)).encode()
    open(f"{out}/{name}", "wb").write(struct.pack("<Q", len(text)) + text + data + tail)
f32 = struct.pack("<4f", 1.0, -2.5, 0.0, 3.25)
bf16 = struct.pack("<3H", 0x3F80, 0xC000, 0x7FC0)
f16 = struct.pack("<2H", 0x3C00, 0x7E00)
st("valid-three-dtypes", [("a", "F32", [2, 2], f32), ("b", "BF16", [3], bf16), ("c", "F16", [2], f16)],
   metadata={"format": "pt"})
st("valid-scalar-and-empty", [("s", "F32", [], struct.pack("<f", 7.0)), ("e", "F32", [0], b"")])
st("valid-int", [("i", "I64", [2], struct.pack("<2q", -1, 1 << 40))])
st("bad-offsets", [("a", "F32", [4], f32)], header=json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}))
st("bad-json", [], header='{"a": {"dtype": "F32"')
st("trailing-bytes", [("a", "F32", [4], f32)], tail=b"xx")
PY

# ---- configs: text, then NUL-separated overrides -------------------------------------
cp "$root/configs/default.textproto" "$corpus/train_config/default"
cp "$root/configs/mlp.textproto" "$corpus/train_config/mlp"
cp "$root/configs/gpt2_124m.textproto" "$corpus/train_config/gpt2_124m"
printf '%s\0%s\0%s\0%s' "$(cat "$root/configs/mlp.textproto")" "model.mlp.dims=4,8,2" \
  "engine.sharding.strategy=shard_grad_op" "engine.optimizer.lr=1e-3" > "$corpus/train_config/mlp-overrides"
printf '%s\0%s\0%s\0%s\0%s' "$(cat "$root/configs/default.textproto")" "model.gpt.layers=2" \
  "compute.fp32_ops=head,h0\\..*" "checkpoint.interval_steps=10" "engine.precision.recipe=AMP_FP16" \
  > "$corpus/train_config/default-overrides"
printf '%s' "model { gpt { layers: 2 } } engine { micro_batches: 0 }" > "$corpus/train_config/bad-micro-batches"
ls -la "$corpus"/*

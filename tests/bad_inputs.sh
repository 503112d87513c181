#!/usr/bin/env bash
# tests/bad_inputs.sh WORKER DIR [--table]: hand-written bad inputs to
# mp_worker, run bare (world size 1, no launcher; mpirun adds 2 s a case and
# only its own notice): config files, --set overrides, token files and
# checkpoints. Each case must end with its exit code and its exact message
# (DIR stands for the scratch directory), within 60 s, leaving no process.
# docs/reliability.md ("Bad input") must show every message: --table prints
# the cases as that Markdown table, without running them.
set -u
worker=$1 dir=$2 mode=${3:-}
src=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
mlp=("$src/configs/mlp.textproto" --steps 2)
gpt=(--set model.gpt.layers=1 --set model.gpt.context=16 --set model.gpt.channels=32 --set model.gpt.heads=2
     --set val_interval=0 --steps 1)
failures=0
messages=()

# expect WHAT EXIT MESSAGE ARGS...: mp_worker ARGS.
expect() {
  local what=$1 code=$2 message=$3
  shift 3
  if [[ $mode == --table ]]; then
    printf '| %s | %s | `%s` |\n' "$what" "$code" "$message"
    return
  fi
  messages+=("$message")
  timeout -k 5 60 "$worker" "$@" > "$dir/out.log" 2>&1
  local rc=$?
  local got
  got=$(sed "s|$dir|DIR|g" "$dir/out.log")
  if [[ $rc -ne $code ]] || ! grep -qF -- "$message" <<< "$got"; then
    echo "FAIL: $what: exit $rc (want $code); want the message"
    echo "    $message"
    echo "  got:"
    sed 's/^/    /' <<< "$got" | tail -n 15
    failures=$((failures + 1))
  else
    echo "ok   $what"
  fi
  [[ -z $(pgrep -f "^[^ ]*mp_worker .*$dir" || true) ]] || fail "$what: worker processes left running"
}

# tokens FILE COUNT_IN_HEADER [MAGIC] [TOKEN...]: an llm.c token file.
tokens() {
  python3 - "$@" <<'PY'
import struct, sys
path, count = sys.argv[1], int(sys.argv[2])
magic = int(sys.argv[3]) if len(sys.argv) > 3 else 20240520
toks = [int(t) for t in sys.argv[4:]] or list(range(1, 65))
header = [magic, 1, count] + [0] * 253
open(path, "wb").write(struct.pack("<256i", *header) + struct.pack(f"<{len(toks)}H", *toks))
PY
}

[[ $mode == --table ]] && { echo "| bad input | exit | message |"; echo "|---|---|---|"; }

# ---- config files and --set ------------------------------------------------------------
: > "$dir/empty.textproto"
expect "empty config file" 2 "model is not set: the config needs model { gpt { ... } } or model { mlp { ... } }" \
  "$dir/empty.textproto"
printf 'model { gpt { layers: } }\n' > "$dir/syntax.textproto"
expect "syntax error" 2 "DIR/syntax.textproto:1:23: Expected integer, got: }" "$dir/syntax.textproto"
printf 'data {\n  micro_batchsize: 4\n}\n' > "$dir/unknown.textproto"
expect "misspelled field" 2 \
  'DIR/unknown.textproto:2:18: Message type "mp.proto.DataConfig" has no field named "micro_batchsize".' \
  "$dir/unknown.textproto"
printf 'data {\n  train_path: "a\\xff.bin"\n}\n' > "$dir/utf8.textproto"
expect "a string that is not UTF-8" 2 "DIR/utf8.textproto:2:3: data.train_path: not valid UTF-8 (text fields are UTF-8)" \
  "$dir/utf8.textproto"
expect "missing config file" 2 "train config 'DIR/none.textproto': cannot open: No such file or directory" "$dir/none.textproto"
expect "negative count" 2 "steps = -5: must be positive" --set steps=-5
expect "huge size" 2 "model.gpt.layers = 99999999999: must be at most 65536" --set model.gpt.layers=99999999999
expect "zero batch" 2 "data.micro_batch_size = 0: must be positive" --set data.micro_batch_size=0
expect "wrong type" 2 "engine.optimizer.lr = 'fast': not a number" --set engine.optimizer.lr=fast
expect "infinite value" 2 "engine.optimizer.lr = 'inf': not a finite number" --set engine.optimizer.lr=inf
expect "unknown enum value" 2 \
  "engine.precision.recipe = 'fp64': not a value of mp.proto.PrecisionPolicy.Recipe; valid: RECIPE_UNSET, RECIPE_FP32," --set engine.precision.recipe=fp64
expect "unknown field in --set" 2 \
  "unknown field 'engine.optimizer.learning_rate': engine.optimizer (mp.proto.OptimizerConfig) has kind, lr, beta1," --set engine.optimizer.learning_rate=1e-3
expect "--set without =" 2 "override 'steps': missing '=' (write field.path=value, e.g. engine.optimizer.lr=3e-4)" --set steps
expect "heads do not divide channels" 2 "model.gpt.heads = 3 does not divide model.gpt.channels = 100" --set model.gpt.channels=100 --set model.gpt.heads=3
expect "recomputation every 1st unit" 2 \
  "activation_checkpointing.every = 1: EVERY_KTH_UNIT needs k >= 2 (EVERY_UNIT is k = 1)" "${gpt[@]}" \
  --set engine.activation_checkpointing.policy=EVERY_KTH_UNIT --set engine.activation_checkpointing.every=1
expect "recomputation of a model that cannot" 2 \
  "activation_checkpointing is on, but the model can recompute none of its 4 units (UnitSpec::recomputable)" \
  "${mlp[@]}" --set engine.activation_checkpointing.policy=EVERY_UNIT
expect "bad fp32_ops regex" 2 \
  "compute.fp32_ops[0] = 'h(0': not a valid ECMAScript regex (Mismatched '(' and ')' in regular expression)" --set "compute.fp32_ops=h(0"

# ---- token files -----------------------------------------------------------------------
: > "$dir/empty.bin"
expect "empty token file" 2 \
  "token file 'DIR/empty.bin': 0 bytes, shorter than the 1024-byte header of an llm.c token file" "${gpt[@]}" --set data.train_path="$dir/empty.bin"
tokens "$dir/magic.bin" 64 12345
expect "not a token file (magic)" 2 \
  "token file 'DIR/magic.bin': magic 12345, expected 20240520 (not an llm.c token file)" "${gpt[@]}" --set data.train_path="$dir/magic.bin"
tokens "$dir/short.bin" 1000
expect "truncated token file" 2 \
  "token file 'DIR/short.bin': the header says 1000 tokens (3024 bytes in all) but the file has 1152 bytes (truncated)" "${gpt[@]}" --set data.train_path="$dir/short.bin"
tokens "$dir/negative.bin" -1
expect "negative token count" 2 "token file 'DIR/negative.bin': negative token count -1" "${gpt[@]}" --set data.train_path="$dir/negative.bin"
tokens "$dir/vocab.bin" 64 20240520 $(seq 1 63) 60000
expect "token id out of range" 2 \
  "token file 'DIR/vocab.bin': token 60000 at position 63 is not below the vocabulary size 256" "${gpt[@]}" --set data.train_path="$dir/vocab.bin"
expect "missing token file" 1 "token file 'DIR/none.bin': cannot open: No such file or directory" "${gpt[@]}" --set data.train_path="$dir/none.bin"

# ---- checkpoints -----------------------------------------------------------------------
ck=$dir/run/checkpoints
step=step_00000002
if [[ $mode != --table ]]; then
  timeout -k 5 60 "$worker" "${mlp[@]}" --out "$dir/run" \
    --set checkpoint.save_at_end=true > "$dir/save.log" 2>&1 || { cat "$dir/save.log"; fail "saving a checkpoint"; }
  [[ $(cat "$ck/latest") == "$step" ]] || fail "the checkpoint is $(cat "$ck/latest"), not $step"
else
  mkdir -p "$ck/$step"
  touch "$ck/$step/shard_00000.bin" "$ck/$step/manifest.pb"
fi
copy() { rm -rf "$dir/$1"; cp -r "$ck" "$dir/$1"; }
expect "--resume of a missing path" 1 \
  "checkpoint 'DIR/nothing': neither a checkpoint (manifest.pb) nor a checkpoint root (latest)" "${mlp[@]}" --resume "$dir/nothing"
copy flipped
python3 -c 'import sys; p=sys.argv[1]; b=bytearray(open(p,"rb").read()) or bytearray(1); b[len(b)//2]^=1; open(p,"wb").write(b)' \
  "$dir/flipped/$step/shard_00000.bin"
expect "a flipped byte in a shard" 2 \
  "checkpoint file 'DIR/flipped/step_00000002/shard_00000.bin': checksum mismatch in bytes [1048576, 2097152) (block 1): the data is corrupt" "${mlp[@]}" --resume "$dir/flipped"
copy truncated
truncate -s -100 "$dir/truncated/$step/shard_00000.bin"
expect "truncated shard" 2 \
  "checkpoint file 'DIR/truncated/step_00000002/shard_00000.bin': 2132700 bytes, the manifest says 2132800 (truncated)" "${mlp[@]}" --resume "$dir/truncated"
copy edited
python3 -c 'import sys; p=sys.argv[1]; b=bytearray(open(p,"rb").read()) or bytearray(1); b[-1]^=1; open(p,"wb").write(b)' \
  "$dir/edited/$step/manifest.pb"
expect "edited manifest" 2 \
  "checkpoint manifest 'DIR/edited/step_00000002/manifest.pb': checksum mismatch (the manifest was edited or is corrupt)" "${mlp[@]}" --resume "$dir/edited"
copy pointer
echo "../../etc" > "$dir/pointer/latest"
expect "latest names no checkpoint" 2 \
  "checkpoint pointer 'DIR/pointer/latest': '../../etc' is not a checkpoint directory name" "${mlp[@]}" --resume "$dir/pointer"
expect "checkpoint of another model" 2 \
  "checkpoint 'DIR/run/checkpoints/step_00000002' has 4 units, the model has 2" "${mlp[@]}" --set model.mlp.dims=64,256,16 --resume "$ck"
expect "checkpoint of another precision" 2 "load with the checkpoint's precision settings" "${mlp[@]}" \
  --set engine.precision.recipe=recipe_fp32 --resume "$ck"

# Devices: no device is visible to these (CUDA_VISIBLE_DEVICES empty), so
# the cases hold on GPU machines too.
export CUDA_VISIBLE_DEVICES=
expect "compute.device CUDA without a GPU" 2 "rank 0: compute.device = CUDA, but" "${gpt[@]}" --set compute.device=CUDA
export MP_FAULT=device_fault@1:0
expect "MP_FAULT device_fault on the CPU" 2 "MP_FAULT device_fault needs a CUDA engine; this one computes on the CPU" \
  "${gpt[@]}"
unset MP_FAULT
export MP_CUDA_SYNC=2
expect "MP_CUDA_SYNC neither 0 nor 1" 2 "MP_CUDA_SYNC = '2': use 1 (synchronise after every CUDA op) or 0" "${gpt[@]}"
unset MP_CUDA_SYNC
export MP_OP_PROFILE=yes
expect "MP_OP_PROFILE neither 0 nor 1" 2 "MP_OP_PROFILE = 'yes': use 1 (print the compute time by op family) or 0" "${gpt[@]}"
unset MP_OP_PROFILE CUDA_VISIBLE_DEVICES

[[ $mode == --table ]] && exit 0
for m in "${messages[@]}"; do
  grep -qF -- "$m" "$src/docs/reliability.md" || { echo "FAIL: docs/reliability.md's bad-input table lacks: $m"; failures=$((failures + 1)); }
done
[[ $failures -eq 0 ]] || fail "$failures case(s)"
echo PASS

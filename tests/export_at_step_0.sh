#!/usr/bin/env bash
# tests/export_at_step_0.sh WORKER DIR: mp_worker --steps 0 --export-safetensors
# writes the initial weights, bit for bit those of a run whose one step
# changes nothing (learning rate 0); and, with --resume, a checkpoint's
# weights, bit for bit those the training run exported when it saved it.
set -u
worker=$1 dir=$2
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
small=(--set model.gpt.layers=2 --set model.gpt.context=32 --set val_interval=0 --set sample_interval=0)
"$worker" "${small[@]}" --steps 0 --export-safetensors "$dir/init" --out "$dir/run0" > "$dir/init.log" 2>&1 ||
  { cat "$dir/init.log"; fail "--steps 0 --export-safetensors"; }
grep -q "no training (--steps 0): exporting the weights of step 0" "$dir/init.log" || { cat "$dir/init.log"; fail "no line"; }
[[ ! -s $dir/run0/metrics.jsonl ]] || fail "--steps 0 trained"
"$worker" "${small[@]}" --steps 1 --set engine.optimizer.lr=0 --set engine.optimizer.schedule.min_lr=0 --export-safetensors "$dir/lr0" --out "$dir/run1" \
  > "$dir/lr0.log" 2>&1 || { cat "$dir/lr0.log"; fail "one step at learning rate 0"; }
cmp "$dir/init/model.safetensors" "$dir/lr0/model.safetensors" || fail "the step-0 export differs from the initial weights"
"$worker" "${small[@]}" --steps 3 --set checkpoint.save_at_end=true --export-safetensors "$dir/trained" \
  --out "$dir/run3" > "$dir/trained.log" 2>&1 || { cat "$dir/trained.log"; fail "3 steps"; }
"$worker" "${small[@]}" --steps 0 --resume "$dir/run3/checkpoints" --export-safetensors "$dir/resumed" \
  --out "$dir/run4" > "$dir/resumed.log" 2>&1 || { cat "$dir/resumed.log"; fail "--resume CKPT --steps 0"; }
grep -q "exporting the weights of step 3" "$dir/resumed.log" || { cat "$dir/resumed.log"; fail "not step 3's weights"; }
cmp "$dir/trained/model.safetensors" "$dir/resumed/model.safetensors" || fail "the checkpoint's export differs"
echo "--steps 0: the initial weights and a checkpoint's exported bit for bit, no step taken"

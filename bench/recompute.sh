#!/usr/bin/env bash
# bench/recompute.sh [WORKER] [BATCH] [STEPS] [ROUNDS]: activation recomputation on
# GPT-2 124M at T = 1024 (vocab 50257, 12 layers, 768 channels, 12 heads;
# the embedded config's FULL_SHARD bf16_master, GEMMs in bf16), one rank,
# without it and with engine.activation_checkpointing EVERY_UNIT and
# EVERY_KTH_UNIT k = 2, in the same run:
#   - activations: the model's bytes at micro-batch BATCH (the exact plan,
#     which the run's measured memory equals; both printed);
#   - the largest micro-batch whose planned bytes per rank fit this
#     machine's memory (MemTotal less 2 GiB for the system), from the plan;
#   - tokens/s at micro-batch BATCH (default 2): the median of steps 2 ..
#     STEPS (default 3; step 1 warms up) over ROUNDS runs of each policy
#     (default 2, interleaved), and its ratio to no recomputation.
# Prints one row per policy and the ratios. Takes a few minutes on 2 cores.
set -euo pipefail
worker=${1:-build/mp_worker}
batch=${2:-2}
steps=${3:-3}
rounds=${4:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
budget=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) * 1024 - (2 << 30) ))
gpt2=(--set model.gpt.vocab=50257 --set model.gpt.context=1024 --set model.gpt.channels=768
      --set model.gpt.heads=12 --set model.gpt.layers=12 --set val_interval=0 --set sample_interval=0)
policy_args() {
  case $1 in
    none) ;;
    every) echo "--set engine.activation_checkpointing.policy=EVERY_UNIT" ;;
    every2) echo "--set engine.activation_checkpointing.policy=EVERY_KTH_UNIT --set engine.activation_checkpointing.every=2" ;;
  esac
}
# plan_bytes POLICY B CATEGORY: the plan's bytes per rank of one row.
plan_bytes() {
  # shellcheck disable=SC2046
  "$worker" --plan "${gpt2[@]}" $(policy_args "$1") --set data.micro_batch_size="$2" |
    awk -v row="$3" '$1 == row {print $2; exit}'
}
max_batch() {
  local lo=0 hi=1
  while (( $(plan_bytes "$1" "$hi" total) <= budget )); do lo=$hi; hi=$((hi * 2)); done
  while (( hi - lo > 1 )); do
    local mid=$(((lo + hi) / 2))
    if (( $(plan_bytes "$1" "$mid" total) <= budget )); then lo=$mid; else hi=$mid; fi
  done
  echo "$lo"
}
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
isa=$(grep -o -m1 -w 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "GPT-2 124M, T = 1024, micro-batch $batch, 1 rank; $cpu (${isa:-no avx512_bf16}), $(nproc) CPUs;" \
     "memory budget $((budget >> 20)) MiB"
printf "%-8s %16s %16s %10s %10s %10s\n" policy "activations MiB" "measured MiB" "max batch" "tokens/s" ratio
# Rounds of every policy in turn, so that a busy spell of the machine falls
# on all of them; tokens/s is the median of a policy's timed steps.
for round in $(seq "$rounds"); do
  for policy in none every every2; do
    # shellcheck disable=SC2046
    "$worker" "${gpt2[@]}" $(policy_args "$policy") --set data.micro_batch_size="$batch" --steps "$steps" \
      --out "$out/$policy.$round" > "$out/$policy.$round.log" 2>&1 || { cat "$out/$policy.$round.log"; exit 1; }
  done
done
base=""
for policy in none every every2; do
  planned=$(plan_bytes "$policy" "$batch" activations)
  read -r tps measured < <(python3 - "$out/$policy".*/metrics.jsonl <<'EOF'
import json, statistics, sys
timed, measured = [], 0
for path in sys.argv[1:]:
    rows = [json.loads(line) for line in open(path)]
    timed += [r["tokens_per_s"] for r in (rows[1:] or rows)]
    measured = rows[-1]["memory_bytes"]["activations"]
print(statistics.median(timed), measured)
EOF
)
  base=${base:-$tps}
  printf "%-8s %16.1f %16.1f %10d %10.1f %10.3f\n" "$policy" "$(echo "$planned / 1048576" | bc -l)" \
    "$(echo "$measured / 1048576" | bc -l)" "$(max_batch "$policy")" "$tps" "$(echo "$tps / $base" | bc -l)"
done

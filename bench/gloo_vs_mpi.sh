#!/usr/bin/env bash
# bench/gloo_vs_mpi.sh [BUILD]: the Gloo data plane (comm/gloo/) against
# MPI's in one run, on 2 ranks x 1 thread: GPT-2 124M's training step
# (mp_bench gpt, FULL_SHARD, over MPI then over Gloo, twice each,
# alternating) and the collectives at 16 and 64 MiB (mp_bench comm_gloo:
# Gloo against the MPI backend on the same buffers). Prints the CPU first;
# writes the JSON lines to bench/results/gloo_vs_mpi.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=bench/results/gloo_vs_mpi.jsonl
mkdir -p bench/results
: >"$out"
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)" \
     "($(grep -o -m1 -w 'avx512_bf16' /proc/cpuinfo || echo 'no avx512_bf16'), $(grep -q -w amx_tile /proc/cpuinfo && echo AMX || echo 'no AMX')); load $(cut -d' ' -f1-3 /proc/loadavg); commit $(git rev-parse --short HEAD)"
run() { MP_NUM_THREADS=1 launch/mprun -np 2 --bind-to none "$build/mp_bench" "$@"; }
for round in 1 2; do
  for plane in mpi gloo; do
    echo "# gpt, data plane $plane (round $round)"
    MP_BENCH_DATA_PLANE=$plane run gpt --sizes 4 --iters 5 --warmup 2 | tee >(grep '^{' | grep gpt2_124m |
      sed "s/^{/{\"data_plane\": \"$plane\", \"round\": $round, /" >>"$out") | grep -E '^# .*gpt2_124m|^# [0-9]+ rank'
  done
done
echo "# comm_gloo"
run comm_gloo --iters 30 --warmup 5 | tee >(grep '^{' >>"$out") | grep '^# '

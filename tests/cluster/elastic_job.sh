#!/usr/bin/env bash
# tests/cluster/elastic_job.sh DIR ROOT STEPS CUT_AT [WORKER ARGS...]: the
# elastic case of test_cluster.py (TestElastic), on the emulated cluster's head node:
# launch/mp_elastic trains STEPS steps on every host; once the run has
# logged CUT_AT steps, the last host's link goes down (both directions).
# Writes DIR/elastic.log (the supervisor's and the job's output) and
# DIR/cut_at (the cut's time, seconds since the epoch); exits with
# mp_elastic's status.
set -u
dir=$1 root=$2 steps=$3 cut_at=$4
shift 4
ns=($MP_CLUSTER_NETNS)
last=${ns[${#ns[@]} - 1]}
"$root/launch/mp_elastic" --restarts 2 --global-batch 4 -- "$@" --steps "$steps" --out "$dir/run" \
  > "$dir/elastic.log" 2>&1 &
pid=$!
for _ in $(seq 1 1200); do
  [[ -s $dir/run/metrics.jsonl && $(wc -l < "$dir/run/metrics.jsonl") -ge $cut_at ]] && break
  sleep 0.05
done
ip -n "$last" link set eth0 down
date +%s.%N > "$dir/cut_at"
echo "$(date -u +%H:%M:%S.%3N): cut ${last}'s link after step $(wc -l < "$dir/run/metrics.jsonl")" >> "$dir/cut.log"
wait "$pid"

#!/usr/bin/env bash
# tests/gpu_check_rehearsal.sh BUILD DIR: scripts/gpu_check rehearsed on the
# CPU (MP_GPU_CHECK_DEVICE=CPU: CPU against CPU, so it proves the script, not
# a GPU), as CTest gpu_check_rehearsal runs it:
#   1. agree (two recipes, checkpoint, verify, export, resume; 16 steps)
#      and report pass, and the call leaves exactly its tarball and its
#      summary under $OUT: at most 8 files, at most 2 folders down, what a
#      GPU machine hands back;
#   2. a call stopped by SIGTERM in the middle of agree still leaves both
#      files, its summary says agree was interrupted, and no worker is left.
set -u
build=$1 dir=$2
script=$(cd "$(dirname "$0")/.." && pwd)/scripts/gpu_check
rm -rf "$dir"
mkdir -p "$dir/out" "$dir/out_stopped"
fail() { echo "FAIL: $*"; exit 1; }

# check_out OUT_DIR TARBALL: exactly the call's two files, and the 8-file rule.
check_out() {
  local n deep
  n=$(find "$1" -type f | wc -l)
  deep=$(find "$1" -mindepth 3 -type f | wc -l)
  echo "$1: $n file(s): $(cd "$1" && find . -type f | sort | tr '\n' ' ')"
  [[ $n -le 8 ]] || fail "$n files under \$OUT: a GPU machine hands back at most 8"
  [[ $deep -eq 0 ]] || fail "files deeper than 2 folders under \$OUT"
  [[ $n -eq 2 && -s $1/$2 && -s $1/gpu_check_summary.json ]] || fail "\$OUT should hold $2 and gpu_check_summary.json"
  tar -tzf "$1/$2" > /dev/null || fail "$2 is not a gzipped tar"
}

# summary_field OUT_DIR EXPR: a Python expression over the summary `s`.
summary_field() { python3 -c "import json,sys; s = json.load(open(sys.argv[1])); print($2)" "$1/gpu_check_summary.json"; }

export MP_GPU_BUILD=$build MP_GPU_CHECK_DEVICE=CPU MP_GPU_CHECK_STEPS=16

# 1. A call that passes.
OUT=$dir/out MP_GPU_CHECK_STATE=$dir/state "$script" agree report || fail "the rehearsal failed (exit $?)"
check_out "$dir/out" gpu_check_agree-report.tar.gz
[[ $(summary_field "$dir/out" "s['result'], s['final'], s['stages']['agree']['status']") == "pass True pass" ]] ||
  fail "the summary does not say pass: $(summary_field "$dir/out" "s['result'], s['stages']")"

# 2. A call stopped by SIGTERM while agree runs (the 10-minute limit's kill).
state=$dir/state_stopped
OUT=$dir/out_stopped MP_GPU_CHECK_STATE=$state "$script" agree report > "$dir/stopped.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
  grep -q "^gpu_check: stage agree" "$state/logs/gpu_check.log" 2> /dev/null && break
  sleep 0.1
done
sleep 0.2
kill -TERM "$pid"
wait "$pid"
rc=$?
cat "$dir/stopped.log"
[[ $rc -ne 0 ]] || fail "a stopped call exited 0"
check_out "$dir/out_stopped" gpu_check_agree-report.tar.gz
[[ $(summary_field "$dir/out_stopped" "s['stages']['agree']['status'], s['stages']['report']['status'], s['final']") == \
   "interrupted skipped True" ]] || fail "the stopped call's summary: $(summary_field "$dir/out_stopped" "s['stages']")"
if pgrep -f "mp_worker .*$state" > /dev/null; then fail "worker processes left running after the stop"; fi
echo PASS

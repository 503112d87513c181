#!/usr/bin/env bash
# tests/expect.sh EXIT SECONDS [-e REGEX]... -- COMMAND...
# Runs COMMAND and passes when it finishes within SECONDS with exit code EXIT
# (a number, or "nonzero") and its output matches every REGEX (extended
# grep, one line each). Used by CTest for end-to-end runs and for failures
# that must be loud and prompt: a regex alone would let a crash pass.
set -u
want=$1 limit=$2
shift 2
regexes=()
while [[ $# -gt 0 && $1 != -- ]]; do
  [[ $1 == -e && $# -ge 2 ]] || { echo "usage: expect.sh EXIT SECONDS [-e REGEX]... -- COMMAND..."; exit 2; }
  regexes+=("$2")
  shift 2
done
shift
start=$(date +%s%N)
out=$(timeout -k 5 "$limit" "$@" 2>&1)
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out" | tail -n 40
echo "exit code $rc after ${elapsed_ms} ms"
if [[ $rc -eq 124 || $rc -eq 137 ]]; then echo "FAIL: still running after ${limit} s"; exit 1; fi
if [[ $want == nonzero ]]; then
  [[ $rc -ne 0 ]] || { echo "FAIL: expected a non-zero exit code"; exit 1; }
elif [[ $rc -ne $want ]]; then
  echo "FAIL: expected exit code $want"; exit 1
fi
for re in "${regexes[@]}"; do
  grep -Eq -- "$re" <<<"$out" || { echo "FAIL: output does not match /$re/"; exit 1; }
done
echo "PASS"

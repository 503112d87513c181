#!/usr/bin/env bash
# tests/gpu_check_rehearsal.sh BUILD DIR: scripts/gpu_check rehearsed on the
# CPU (MP_GPU_CHECK_DEVICE=CPU: CPU against CPU, so it proves the script, not
# a GPU), as CTest gpu_check_rehearsal runs it:
#   0. the call without arguments runs the stages docs/gpu.md's first
#      command names (its tarball's name);
#   1. agree (two recipes, checkpoint, verify, export, resume; 16 steps)
#      and report pass, and the call leaves exactly its tarball and its
#      summary under $OUT: at most 8 files, at most 2 folders down, what a
#      GPU machine hands back;
#   2. gemm gpt2 report, GPT-2 shrunk to a tiny GPT (the stage's logic,
#      not its numbers) at B = 4 and 16: gemm is skipped, saying it needs a
#      device; gpt2 passes as a stage (report fails: rows missed their
#      targets) with a row per batch whose ops per step are those of the
#      worker's log, its targets judged (missed: no
#      PyTorch on the GPU here), torch.compile skipped by name where its
#      time is not left, the stage's limit what the deadline leaves after
#      the later stages' expected times; the tarball holds every stage's
#      logs and rows;
#   3. a call stopped by SIGTERM in the middle of agree still leaves both
#      files, its summary says agree was interrupted, and no worker is left.
set -u
build=$1 dir=$2
script=$(cd "$(dirname "$0")/.." && pwd)/scripts/gpu_check
rm -rf "$dir"
mkdir -p "$dir/out" "$dir/out_gpt2" "$dir/out_stopped"
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

# 0. The call without arguments is the first command docs/gpu.md sends.
first=$(sed -n 's/^first_command=(\([a-z0-9 ]*\)).*/\1/p' "$script")
[[ -n $first ]] || fail "scripts/gpu_check has no first_command=(...) line"
grep -qF "gpu_check_${first// /-}.tar.gz" "$(dirname "$script")/../docs/gpu.md" ||
  fail "docs/gpu.md does not name the first command's tarball gpu_check_${first// /-}.tar.gz"

# 1. A call that passes.
OUT=$dir/out MP_GPU_CHECK_STATE=$dir/state "$script" agree report || fail "the rehearsal failed (exit $?)"
check_out "$dir/out" gpu_check_agree-report.tar.gz
[[ $(summary_field "$dir/out" "s['result'], s['final'], s['stages']['agree']['status']") == "pass True pass" ]] ||
  fail "the summary does not say pass: $(summary_field "$dir/out" "s['result'], s['stages']")"

# 2. The gemm and gpt2 stages' logic, on a tiny GPT.
state=$dir/state_gpt2
MP_GPU_CHECK_DEADLINE_S=300 MP_GPU_CHECK_COMPILE_S=100000 MP_GPU_CHECK_GPT2_STEPS=8 \
  MP_GPU_CHECK_GPT2_ARGS="--set model.gpt.vocab=256 --set model.gpt.context=32 --set model.gpt.channels=32 \
    --set model.gpt.heads=2 --set model.gpt.layers=1" \
  OUT=$dir/out_gpt2 MP_GPU_CHECK_STATE=$state "$script" gemm gpt2 report > "$dir/gpt2.log" 2>&1
rc=$?
cat "$dir/gpt2.log"
[[ $rc -eq 1 ]] || fail "a call with a skipped stage and missed targets should exit 1, not $rc"
check_out "$dir/out_gpt2" gpu_check_gemm-gpt2-report.tar.gz
[[ $(summary_field "$dir/out_gpt2" "s['stages']['gemm']['status'], 'needs a CUDA device' in s['stages']['gemm']['note']") \
   == "skipped True" ]] || fail "gemm should be skipped, saying it needs a device: $(summary_field "$dir/out_gpt2" "s['stages']['gemm']")"
# (report fails as a stage too: its exit status says that a row missed its target)
[[ $(summary_field "$dir/out_gpt2" "s['stages']['gpt2']['status'], s['stages']['report']['status'], s['result']") == \
   "pass fail fail" ]] || fail "gpt2 should pass as a stage, its rows fail: $(summary_field "$dir/out_gpt2" "s")"
for b in 4 16; do
  ops=$(sed -n 's/^ops per step (rank 0): \([0-9]*\) .*/\1/p' "$state/logs/gpt2_b$b.log" | head -n 1)
  [[ -n $ops ]] || fail "no ops line in logs/gpt2_b$b.log"
  row=$(summary_field "$dir/out_gpt2" "[r for r in s['stages']['gpt2']['rows'] if r['case'] == 'gpt2_124m_b$b'][0]")
  echo "B=$b: ops per step $ops; $row"
  [[ $(summary_field "$dir/out_gpt2" "[(r['batch'], r['ops_per_step'], r['pass'], r['tokens_per_s'] > 0) for r in
       s['stages']['gpt2']['rows'] if r['case'] == 'gpt2_124m_b$b']") == "[($b, $ops, False, True)]" ]] ||
    fail "the B=$b row should carry the log's $ops ops per step and fail its targets: $row"
done
[[ $(summary_field "$dir/out_gpt2" "[r['missed'] for r in s['stages']['gpt2']['rows'] if r['case'] == 'gpt2_124m_b4'][0]") \
   == "['ratio_to_torch_amp_bf16 not measured']" ]] || fail "B=4 should miss only its eager ratio (no PyTorch on a GPU here)"
note=$(summary_field "$dir/out_gpt2" "s['stages']['gpt2']['note']")
[[ $note == *"torch amp_bf16_compile at B=16 skipped"*"torch amp_bf16_compile at B=4 skipped"* ]] ||
  fail "torch.compile should be skipped by name, B=16 first: '$note'"
limit=$(sed -n 's/^gpu_check: stage gpt2 (at most \([0-9]*\) s)$/\1/p' "$state/logs/gpu_check.log")
[[ -n $limit && $limit -le 275 && $limit -ge 250 ]] ||
  fail "gpt2's limit should be the deadline's 300 s less 20 for handing back and 5 for report: '$limit'"
listing=$(tar -tzf "$dir/out_gpt2/gpu_check_gemm-gpt2-report.tar.gz")
for f in logs/gpu_check.log logs/gpt2_b4.log logs/gpt2_b16.log logs/gpt2_profile.log logs/torch_gpt2.log gpt2.jsonl \
         gpt2_b16/metrics.jsonl gpu_check_summary.json call.tsv; do
  grep -qx "\./$f" <<< "$listing" || fail "the tarball lacks $f: $listing"
done

# 3. A call stopped by SIGTERM while agree runs (the 10-minute limit's kill).
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

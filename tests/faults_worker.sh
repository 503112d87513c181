#!/usr/bin/env bash
# tests/faults_worker.sh CASE MPRUN WORKER DIR: mp_worker under injected
# faults (MP_FAULT, runtime/fault.h), 2 ranks, the small GPT:
#   kill:       rank 1 SIGKILLed at step 4: every rank exits non-zero
#               promptly, mpirun names rank 1, nothing is left running.
#   hang:       rank 1 stops at step 4: rank 0's collective times out (3 s)
#               naming the collective and rank 1; the job ends; the last
#               checkpoint (every step) verifies and resumes. Again with 4
#               micro-batches, where the host runs far ahead of the stream.
#   straggler:  rank 1 sleeps 1.5 s at step 4 (timeout 10 s): training
#               goes on and the log names rank 1 at step 4.
#   nan:        rank 1's gradients of unit 2 are NaN at steps 4-5: both
#               steps are skipped on every rank, the log names rank 1 and
#               unit h1 (with engine.locate_non_finite), and the run finishes; with non_finite=NON_FINITE_STOP
#               it stops at step 4 naming them; with max_consecutive_skips=2
#               and NaN at steps 4-9 it stops at step 5.
#   write_fail: rank 1's checkpoint write fails at step 4: every rank
#               prints the error and exits non-zero without MPI_Abort, and
#               `latest` still names step 2's checkpoint, which verifies.
#   write_fail_async: the same with checkpoint.async_save: rank 1's
#               background write of step 4 fails; the error surfaces on every
#               rank at the commit (at a later step boundary) naming the file,
#               and `latest` still names step 2's checkpoint, which verifies.
#   device_fault (CUDA ranks only: scripts/gpu_check): rank 1's GPU runs an
#               illegal memory access at step 4: the job ends, the error
#               names rank 1, its device, the step and the last collective;
#               with MP_CUDA_SYNC=1 it names the kernel that faulted.
# MP_FAULT_WORKER_ARGS (words) go to every mp_worker run: scripts/gpu_check
# runs these cases on GPUs with "--set compute.device=CUDA ...".
# Prints what it measured (time to detect, steps lost) and PASS.
set -u
case_name=$1 mprun=$2 worker=$3 dir=$4
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
small=(--set model.gpt.layers=2 --set model.gpt.context=32 --set log_interval=1 --steps 12)
read -r -a extra <<< "${MP_FAULT_WORKER_ARGS:-}"
small+=("${extra[@]}")
ranks() { pgrep -f "^[^ ]*mp_worker .*$dir" || true; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# run NAME [MP_FAULT] [args...]: the worker on 2 ranks; sets rc and ms.
run() {
  local name=$1 fault=$2
  shift 2
  local t0
  t0=$(now_ms)
  MP_FAULT=$fault timeout -k 5 120 "$mprun" -np 2 --bind-to none "$worker" "${small[@]}" "$@" > "$dir/$name.log" 2>&1
  rc=$?
  ms=$(( $(now_ms) - t0 ))
  # (mpirun itself exits 137 when a rank died of SIGKILL: time tells a timeout apart)
  [[ $ms -lt 120000 ]] || { tail -n 20 "$dir/$name.log"; fail "$name: still running after 120 s"; }
  [[ -z $(ranks) ]] || fail "$name: worker processes left running"
}
# agreed_exit NAME: every rank stopped on the same error and ended itself
# (launch/rank_main.h): no MPI_Abort, which can kill a rank before it prints.
agreed_exit() {
  ! grep -q "MPI_ABORT" "$dir/$1.log" || { tail -n 30 "$dir/$1.log"; fail "$1: MPI_Abort on an error every rank agreed on"; }
}
expect() { grep -Eq -- "$2" "$dir/$1.log" || { tail -n 30 "$dir/$1.log"; fail "$1: no line matching /$2/"; }; }

case $case_name in
kill)
  run kill "kill@4:1"
  [[ $rc -ne 0 ]] || fail "exit code 0 after a rank was killed"
  expect kill "MP_FAULT: SIGKILL at step 4"
  expect kill "rank 1 .*(exited on signal 9|Killed)"
  echo "kill: rank 1 SIGKILLed at step 4; the job ended with exit code $rc in $ms ms from start, naming rank 1"
  ;;
hang)
  run hang "hang@4:1" --out "$dir/run" --set checkpoint.interval_steps=1 --set engine.comm.timeout_s=3
  [[ $rc -ne 0 ]] || fail "exit code 0 after a rank hung"
  hang_rc=$rc hang_ms=$ms
  expect hang "did not complete within 3 s"
  expect hang "Not arrived: rank 1"
  last=$(cat "$dir/run/checkpoints/latest")
  [[ $last == step_00000003 ]] || fail "latest is $last, expected step_00000003 (the step before the hang)"
  "$worker" --verify-checkpoint "$dir/run/checkpoints" > "$dir/verify.log" 2>&1 || { cat "$dir/verify.log"; fail "verify"; }
  run resume "" --out "$dir/run" --resume auto
  [[ $rc -eq 0 ]] || { tail -n 20 "$dir/resume.log"; fail "resume after the hang"; }
  expect resume "^resumed from .*step_00000003 at step 3 "
  echo "hang: rank 1 stopped at step 4; rank 0 named it after the 3 s timeout; the job ended in $hang_ms ms from" \
       "start (exit $hang_rc); checkpoint step 3 verified and resumed: 0 completed steps lost"
  # With 4 micro-batches the host enqueues far ahead of the compute stream
  # (Note [Host runs ahead]); its waits must stay bounded all the same.
  run hang_accumulating "hang@4:1" --out "$dir/run4" --set engine.micro_batches=4 --set engine.comm.timeout_s=3
  [[ $rc -ne 0 ]] || fail "exit code 0 after a rank hung (4 micro-batches)"
  expect hang_accumulating "did not complete within 3 s"
  expect hang_accumulating "Not arrived: rank 1"
  [[ $ms -lt 30000 ]] || fail "the hung rank was named only after $ms ms (timeout 3 s)"
  echo "hang with 4 micro-batches: named the same way; the job ended in $ms ms from start"
  ;;
straggler)
  run straggler "sleep@4:1:1.5" --set engine.comm.timeout_s=10
  [[ $rc -eq 0 ]] || { tail -n 20 "$dir/straggler.log"; fail "exit code $rc with a straggler below the timeout"; }
  expect straggler "^step 4: rank 1 is a straggler: [1-9]\.[0-9]+ s of work in this step"
  expect straggler "^done: 12 steps"
  n=$(grep -c "is a straggler" "$dir/straggler.log")
  [[ $n -le 2 ]] || fail "$n straggler lines: only step 4 had one (one more allowed for scheduling noise)"
  echo "straggler: rank 1 slept 1.5 s at step 4; training went on and the log named it at step 4"
  ;;
nan)
  run nan_unlocated "nan@4:1:2"
  [[ $rc -eq 0 ]] || fail "exit code $rc: a skipped step should not end the run"
  expect nan_unlocated "^step 4 skipped: non-finite gradients, set engine.locate_non_finite=true to name the rank and unit"
  small+=(--set engine.locate_non_finite=true)
  run nan "nan@4-5:1:2"
  [[ $rc -eq 0 ]] || { tail -n 20 "$dir/nan.log"; fail "exit code $rc: skipped steps should not end the run"; }
  expect nan "^step 4 skipped: non-finite gradients, first from rank 1, unit h1; 1 in a row"
  expect nan "^step 5 skipped: non-finite gradients, first from rank 1, unit h1; 2 in a row"
  expect nan "^step  4/12 .*SKIPPED"
  expect nan "^done: 12 steps"
  [[ $(grep -c "skipped: non-finite" "$dir/nan.log") -eq 2 ]] || fail "expected exactly 2 skipped steps"
  run nan_stop "nan@4:1:2" --set engine.non_finite=NON_FINITE_STOP
  [[ $rc -ne 0 ]] || fail "NON_FINITE_STOP: exit code 0"
  for r in 0 1; do
    expect nan_stop "^\\[rank $r\\] .*step 4: non-finite gradients, first from rank 1, unit h1; stopping \(non_finite = NON_FINITE_STOP\)"
  done
  agreed_exit nan_stop
  run nan_repeat "nan@4-9:1:2" --set engine.max_consecutive_skips=2
  [[ $rc -ne 0 ]] || fail "max_consecutive_skips: exit code 0"
  for r in 0 1; do expect nan_repeat "^\\[rank $r\\] .*step 5: 2 steps in a row had non-finite gradients"; done
  agreed_exit nan_repeat
  echo "nan: steps 4-5 skipped and named (rank 1, unit h1), run finished; NON_FINITE_STOP stopped at step 4;" \
       "max_consecutive_skips=2 stopped at step 5"
  ;;
write_fail)
  run write_fail "write_fail@4:1" --out "$dir/run" --set checkpoint.interval_steps=2
  [[ $rc -ne 0 ]] || fail "exit code 0 after a failed checkpoint write"
  expect write_fail "^\\[rank 0\\] .*checkpoint save failed on rank 1: .*shard_00001.bin': write failed: No space left on device"
  expect write_fail "^\\[rank 1\\] .*shard_00001.bin': write failed: No space left on device"
  agreed_exit write_fail
  [[ $(cat "$dir/run/checkpoints/latest") == step_00000002 ]] || fail "latest moved off step 2"
  "$worker" --verify-checkpoint "$dir/run/checkpoints" > "$dir/verify.log" 2>&1 || { cat "$dir/verify.log"; fail "verify"; }
  cat "$dir/verify.log"
  echo "write_fail: step 4's save failed on rank 1; every rank stopped with the error; step 2's checkpoint stays latest and verifies"
  ;;
write_fail_async)
  run write_fail_async "write_fail@4:1" --out "$dir/run" --set checkpoint.interval_steps=2 \
    --set checkpoint.async_save=true
  [[ $rc -ne 0 ]] || fail "exit code 0 after a failed background checkpoint write"
  expect write_fail_async "^checkpoint at step 4 \(interval\): snapshot of .* writing in the background"
  expect write_fail_async "^\\[rank 0\\] .*checkpoint save failed on rank 1: .*shard_00001.bin': write failed: No space left on device"
  expect write_fail_async "^\\[rank 1\\] .*shard_00001.bin': write failed: No space left on device"
  agreed_exit write_fail_async
  ! grep -q "^checkpoint at step 4 committed" "$dir/write_fail_async.log" || fail "step 4 was committed"
  [[ $(cat "$dir/run/checkpoints/latest") == step_00000002 ]] || fail "latest moved off step 2"
  "$worker" --verify-checkpoint "$dir/run/checkpoints" > "$dir/verify.log" 2>&1 || { cat "$dir/verify.log"; fail "verify"; }
  cat "$dir/verify.log"
  echo "write_fail_async: step 4's background write failed on rank 1; every rank stopped with the error at the" \
       "commit; step 2's checkpoint stays latest and verifies"
  ;;
device_fault)
  run device_fault "device_fault@4:1" --set engine.comm.timeout_s=5
  [[ $rc -ne 0 ]] || fail "exit code 0 after a device fault"
  expect device_fault "MP_FAULT: device fault on cuda:[0-9]+ at step 4"
  # The fault surfaces at the rank's next CUDA call: on its compute thread
  # (Engine::step adds where: rank, device, step, last collective) or on
  # its communication thread (a CommError naming the collective).
  expect device_fault "\[rank 1\] .*(illegal memory access|IllegalAddress)"
  expect device_fault "\[rank 1 on cuda:[0-9]+, step 4; last collective issued: |\[rank 1\] .*CommError|collective"
  fault_ms=$ms
  MP_CUDA_SYNC=1 run device_fault_sync "device_fault@4:1" --set engine.comm.timeout_s=5
  [[ $rc -ne 0 ]] || fail "exit code 0 after a device fault (MP_CUDA_SYNC=1)"
  expect device_fault_sync "\[rank 1\] .*op device_fault on cuda:[0-9]+ failed: cudaErrorIllegalAddress"
  echo "device_fault: rank 1's illegal memory access at step 4 ended the job in $fault_ms ms from start, naming" \
       "rank 1, its device, the step and the last collective; with MP_CUDA_SYNC=1, the kernel"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
echo PASS

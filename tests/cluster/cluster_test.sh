#!/usr/bin/env bash
# tests/cluster/cluster_test.sh CASE WORKER DIR: mp_worker on an emulated
# cluster (scripts/cluster: hosts as network namespaces, TCP between them,
# launched by launch/mp_multinode as on a real cluster). CTest label
# "cluster"; exit 77 (skipped) where the kernel refuses namespaces.
#   hybrid: 2 hosts x 2 ranks, deterministic: HYBRID_SHARD (shard inside a
#           host, replicate across) = FULL_SHARD on the 4 ranks = 1 rank
#           with 4 micro-batches, bit for bit (losses, norms, weights).
#   resume: a checkpoint written by 2 hosts x 2 ranks resumes on 1 host x
#           3 ranks and continues exactly as the uninterrupted run.
#   cut:    node1's link goes down mid-run: every rank ends within the
#           communication timeout plus a few seconds, the error names the
#           host and its ranks, nothing is left behind.
#   slow:   3 hosts, node1 at a tenth of the others' bandwidth: training
#           goes on and the log names node1.
#   slurm:  Slurm on the cluster (scripts/cluster --slurm): `sbatch
#           launch/mp.sbatch` trains on 2 hosts x 2 ranks; a second job is
#           preempted (scancel --signal=TERM: it checkpoints and exits 0),
#           requeued (scontrol requeue) and resumes with --resume auto: its
#           steps equal the uninterrupted job's bit for bit
#           (tests/cluster/slurm_jobs.sh runs the jobs).
#   srun:   Slurm on the cluster: `srun -N 2 -n 2 python examples/torch_llama.py`
#           (no MPI: Slurm's variables say who each task is, the ranks meet
#           at a store on node0 and train over Gloo); MP_PYTHON is the
#           Python with torch and mp (python/CMakeLists.txt runs this case).
#   elastic: launch/mp_elastic on 2 hosts x 2 ranks; node1's link is cut
#           after step 10 of 30: the job ends naming node1, the supervisor
#           relaunches on node0 alone (2 ranks, 2 micro-batches each) from
#           the last verified checkpoint, and training reaches step 30; the
#           steps after the restart equal a clean resume from the same
#           checkpoint on 2 ranks, bit for bit; the log says how long it
#           took from the cut to training again.
set -u
case_name=$1 worker=$2 dir=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
cluster=$root/scripts/cluster
multinode=$root/launch/mp_multinode
export MP_WORKER=$worker
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
small=(--set model.gpt.layers=2 --set model.gpt.context=32 --set engine.optimizer.schedule.total_steps=400
       --set log_interval=1 --set engine.deterministic=true --set engine.precision.reduce_dtype=FP32)

# "step loss norm" per step of a run directory's metrics.jsonl.
losses() { python3 -c 'import json,sys
for l in open(sys.argv[1]):
    j = json.loads(l); print(j["step"], repr(j["loss"]), repr(j["grad_norm"]))' "$1"; }

# run NAME CLUSTER_ARGS... -- WORKER_ARGS...: on the cluster (or with no
# cluster args and "local N", under mprun on this host), logging to DIR/NAME.log.
on_cluster() {
  local name=$1; shift
  local cargs=()
  while [[ $1 != -- ]]; do cargs+=("$1"); shift; done
  shift
  "$cluster" "${cargs[@]}" -- "$multinode" -- "${small[@]}" --out "$dir/$name" "$@" >"$dir/$name.log" 2>&1
}
local_run() {  # NAME NP WORKER_ARGS...
  local name=$1 np=$2; shift 2
  "$root/launch/mprun" -np "$np" --bind-to none "$worker" "${small[@]}" --out "$dir/$name" "$@" >"$dir/$name.log" 2>&1
}
skip_if_refused() {  # LOG STATUS
  [[ $2 -eq 77 ]] && { grep "cannot emulate" "$1"; exit 77; }
  return 0
}

case $case_name in
hybrid)
  on_cluster hybrid --hosts 2 --ranks 2 -- --steps 4 --set engine.sharding.strategy=HYBRID_SHARD \
    --set engine.sharding.hybrid_shard_size=2 --export-safetensors "$dir/hybrid.hf"
  status=$?; skip_if_refused "$dir/hybrid.log" $status
  [[ $status -eq 0 ]] || { cat "$dir/hybrid.log"; fail "HYBRID_SHARD on 2 hosts x 2 ranks"; }
  grep -q "^  rank 2: node1 " "$dir/hybrid.log" || { cat "$dir/hybrid.log"; fail "rank 2 did not run on node1"; }
  on_cluster full --hosts 2 --ranks 2 -- --steps 4 --set engine.sharding.strategy=FULL_SHARD \
    --export-safetensors "$dir/full.hf" || { cat "$dir/full.log"; fail "FULL_SHARD on 2 hosts x 2 ranks"; }
  local_run one 1 --steps 4 --set engine.micro_batches=4 --export-safetensors "$dir/one.hf" ||
    { cat "$dir/one.log"; fail "1 rank"; }
  for r in hybrid full one; do losses "$dir/$r/metrics.jsonl" >"$dir/$r.txt"; done
  [[ $(wc -l <"$dir/one.txt") -eq 4 ]] || fail "the 1-rank run wrote $(wc -l <"$dir/one.txt") metrics lines"
  diff "$dir/one.txt" "$dir/hybrid.txt" || fail "HYBRID_SHARD on 2 hosts differs from 1 rank (losses, norms)"
  diff "$dir/one.txt" "$dir/full.txt" || fail "FULL_SHARD on 2 hosts differs from 1 rank (losses, norms)"
  cmp "$dir/one.hf/model.safetensors" "$dir/hybrid.hf/model.safetensors" || fail "HYBRID_SHARD weights differ from 1 rank's"
  cmp "$dir/one.hf/model.safetensors" "$dir/full.hf/model.safetensors" || fail "FULL_SHARD weights differ from 1 rank's"
  echo "2 hosts x 2 ranks: HYBRID_SHARD = FULL_SHARD = 1 rank x 4 micro-batches, bit for bit (4 steps: losses, norms, weights)"
  ;;
resume)
  # 12 micro-batches a step either way: 4 ranks x 3, then 3 ranks x 4.
  on_cluster two_hosts --hosts 2 --ranks 2 -- --steps 6 --set engine.micro_batches=3 \
    --set checkpoint.interval_steps=3
  status=$?; skip_if_refused "$dir/two_hosts.log" $status
  [[ $status -eq 0 ]] || { cat "$dir/two_hosts.log"; fail "2 hosts x 2 ranks"; }
  on_cluster one_host --hosts 1 --ranks 3 -- --steps 6 --set engine.micro_batches=4 \
    --resume "$dir/two_hosts/checkpoints/step_00000003" || { cat "$dir/one_host.log"; fail "resume on 1 host x 3 ranks"; }
  grep -q "^resumed from .*step_00000003 at step 3 (saved by 4 rank(s)" "$dir/one_host.log" ||
    { cat "$dir/one_host.log"; fail "no resume line"; }
  losses "$dir/two_hosts/metrics.jsonl" | sed -n '4,6p' >"$dir/want.txt"
  losses "$dir/one_host/metrics.jsonl" >"$dir/got.txt"  # a fresh run directory: steps 4-6 only
  [[ $(wc -l <"$dir/got.txt") -eq 3 ]] || fail "the resumed run wrote no steps 4-6"
  diff "$dir/want.txt" "$dir/got.txt" || fail "steps 4-6 on 1 host x 3 ranks differ from the 2 x 2 run's"
  echo "checkpoint of 2 hosts x 2 ranks at step 3 resumed on 1 host x 3 ranks: steps 4-6 bit for bit"
  ;;
cut)
  timeout_s=6
  start=$(date +%s)
  "$cluster" --hosts 2 --ranks 2 --cut 1:8 -- bash -c \
    'echo "$MP_CLUSTER_NETNS" > "$0/netns"; exec "$@"' "$dir" \
    "$multinode" -- "${small[@]}" --set engine.deterministic=false --steps 1000000 --out "$dir/run" \
    --set engine.comm.timeout_s=$timeout_s >"$dir/cut.log" 2>&1
  status=$? elapsed=$(( $(date +%s) - start ))
  skip_if_refused "$dir/cut.log" $status
  [[ $status -ne 0 ]] || { cat "$dir/cut.log"; fail "the run exited 0 after its link was cut"; }
  grep -q "node1's link is down" "$dir/cut.log" || { cat "$dir/cut.log"; fail "the link was not cut (the run ended first?)"; }
  grep -Eq "Host node1 unreachable: none of its ranks answered \(2, 3\)" "$dir/cut.log" ||
    { cat "$dir/cut.log"; fail "no error naming node1 and its ranks"; }
  grep -Eq "rank 2 on node1, rank 3 on node1" "$dir/cut.log" || { cat "$dir/cut.log"; fail "the error does not name the ranks' host"; }
  # Cut at 8 s (training by then, even on a loaded machine); the ranks'
  # deadline is the timeout plus the 2 s diagnosis and the 5 s abort grace;
  # mpirun then gives up on node1 within ~13 s (tcp_retries2 = 5).
  limit=$(( 8 + timeout_s + 2 + 5 + 20 ))
  (( elapsed <= limit )) || { cat "$dir/cut.log"; fail "the job took ${elapsed} s to end (limit ${limit} s)"; }
  for ns in $(cat "$dir/netns"); do ip netns list | grep -qw "$ns" && fail "namespace $ns left behind"; done
  pgrep -f "mp_worker .*$dir/run" && fail "ranks left running"
  echo "link cut at 8 s: the job ended after ${elapsed} s (timeout ${timeout_s} s), naming node1 and ranks 2, 3; nothing left"
  ;;
slurm)
  steps=30
  "$cluster" --hosts 2 --ranks 2 --slurm -- bash "$root/tests/cluster/slurm_jobs.sh" "$dir" "$root" "$worker" \
    "$steps" "${small[@]}" >"$dir/slurm.log" 2>&1
  status=$?; skip_if_refused "$dir/slurm.log" $status
  [[ $status -eq 0 ]] || { cat "$dir/slurm.log" "$dir"/*.out; fail "the Slurm jobs"; }
  grep -q "^reference job [0-9]*: COMPLETED" "$dir/slurm.log" || { cat "$dir/slurm.log" "$dir"/ref-*.out; fail "sbatch"; }
  grep -Eq "^  rank 3: node1 " "$dir"/ref-*.out || { cat "$dir"/ref-*.out; fail "rank 3 did not run on node1"; }
  grep -q "^preempted job [0-9]*: COMPLETED" "$dir/slurm.log" || { cat "$dir/slurm.log" "$dir"/pre-*.out; fail "scancel --signal=TERM"; }
  grep -q "got SIGTERM at step [0-9]* of $steps: checkpoint saved" "$dir/pre-first.out" ||
    { cat "$dir/pre-first.out"; fail "the preempted job did not checkpoint on SIGTERM"; }
  grep -q "^requeued job [0-9]*: COMPLETED" "$dir/slurm.log" || { cat "$dir/slurm.log" "$dir"/pre-*.out; fail "requeue"; }
  stop=$(sed -n "s/.*got SIGTERM at step \([0-9]*\) of.*/\1/p" "$dir/pre-first.out")
  grep -q "^resumed from .*step_0*$stop at step $stop" "$dir"/pre-[0-9]*.out || { cat "$dir"/pre-*.out; fail "no resume line"; }
  losses "$dir/ref/metrics.jsonl" >"$dir/want.txt"
  losses "$dir/pre/metrics.jsonl" >"$dir/got.txt"
  [[ $(wc -l <"$dir/want.txt") -eq $steps ]] || fail "the reference job wrote $(wc -l <"$dir/want.txt") steps"
  diff "$dir/want.txt" "$dir/got.txt" || fail "the preempted and requeued job's steps differ from the uninterrupted one's"
  cluster=$(sed -n 's/^scripts\/cluster: cluster \(mpc[0-9]*\):.*/\1/p' "$dir/slurm.log")
  ! ip netns list | grep -q "^${cluster}[hd]" || fail "namespaces of $cluster left behind"
  ! pgrep -af "mp_cluster\.[A-Za-z0-9]*/slurm/" || fail "Slurm or munge daemons left running"
  echo "sbatch on 2 hosts x 2 ranks; preempted at step $stop (SIGTERM: checkpoint, exit 0), requeued, resumed:" \
       "$steps steps bit for bit"
  ;;
srun)
  # MASTER_ADDR: node0's address (the emulated hosts' names are not in DNS).
  "$cluster" --hosts 2 --ranks 2 --slurm -- bash -c '
    export MASTER_ADDR=$(scontrol show node node0 | sed -n "s/.*NodeAddr=\([^ ]*\).*/\1/p")
    exec srun -N 2 -n 2 --mpi=none "$@"' srun "$MP_PYTHON" "$root/examples/torch_llama.py" --steps 3 --layers 2 \
    --threads 1 --recipe RECIPE_FP32 --deterministic >"$dir/srun.log" 2>&1
  status=$?; skip_if_refused "$dir/srun.log" $status
  [[ $status -eq 0 ]] || { cat "$dir/srun.log"; fail "srun -N 2 -n 2 python examples/torch_llama.py"; }
  grep -q "ranks: Slurm (SLURM_PROCID=0, .*): rank 0 of 2.*data plane: Gloo over TCP, MPI not started" "$dir/srun.log" ||
    { cat "$dir/srun.log"; fail "rank 0 did not find its ranks in Slurm's variables"; }
  grep -q "^step    3  loss" "$dir/srun.log" || { cat "$dir/srun.log"; fail "no third step"; }
  echo "srun -N 2 -n 2 python examples/torch_llama.py: Slurm's ranks, Gloo, 3 steps"
  ;;
elastic)
  steps=30
  export MP_FAULT="sleep@1-1000:0:0.15"  # rank 0 sleeps 0.15 s a step: the cut lands mid-run
  "$cluster" --hosts 2 --ranks 2 -- bash "$root/tests/cluster/elastic_job.sh" "$dir" "$root" "$steps" 10 \
    "${small[@]}" --set checkpoint.interval_steps=5 --set checkpoint.keep_last=10 --set engine.comm.timeout_s=6 \
    >"$dir/cluster.log" 2>&1
  status=$?; skip_if_refused "$dir/cluster.log" $status
  unset MP_FAULT
  log=$dir/elastic.log
  [[ $status -eq 0 ]] || { cat "$dir/cluster.log" "$log"; fail "the elastic run did not finish (exit $status)"; }
  grep -Eq "Host node1 unreachable: none of its ranks answered \(2, 3\)" "$log" ||
    { cat "$log"; fail "the failed launch did not name node1 and its ranks"; }
  grep -q "node1 does not answer: left out" "$log" || { cat "$log"; fail "node1 was not left out"; }
  grep -q "launch 1: 1 host(s) (node0) x 2 ranks, 2 micro-batch(es) each, --resume " "$log" ||
    { cat "$log"; fail "no relaunch on node0 alone"; }
  ckpt=$(sed -n 's/.*: \(.*\/step_[0-9]*\) verifies$/\1/p' "$log" | head -1)
  [[ -n $ckpt ]] || { cat "$log"; fail "no verified checkpoint named"; }
  from=$((10#${ckpt##*step_}))
  grep -q "launch 1 finished training" "$log" || { cat "$log"; fail "the relaunch did not finish"; }
  losses "$dir/run/metrics.jsonl" >"$dir/elastic.txt"
  [[ $(tail -1 "$dir/elastic.txt" | cut -d' ' -f1) -eq $steps ]] || fail "the run did not reach step $steps"
  local_run clean 2 --steps "$steps" --set engine.micro_batches=2 --resume "$ckpt" ||
    { cat "$dir/clean.log"; fail "the clean resume"; }
  losses "$dir/clean/metrics.jsonl" >"$dir/clean.txt"
  awk -v f="$from" '$1 > f' "$dir/elastic.txt" >"$dir/after.txt"
  [[ $(wc -l <"$dir/after.txt") -eq $((steps - from)) ]] || fail "the elastic run logged $(wc -l <"$dir/after.txt") steps after $from"
  diff "$dir/clean.txt" "$dir/after.txt" || fail "the steps after the restart differ from a clean resume of $ckpt"
  back=$(sed -n 's/^mp_elastic \[\([0-9:.]*\)\]: training again at step.*/\1/p' "$log" | head -1)
  cut_s=$(cat "$dir/cut_at")
  took=$(python3 -c "import datetime,sys; c=float(sys.argv[1]); d=datetime.datetime.fromtimestamp(c, datetime.timezone.utc)
h,m,s=sys.argv[2].split(':'); b=d.replace(hour=int(h),minute=int(m),second=0,microsecond=0).timestamp()+float(s)
print(f'{b - c:.1f}')" "$cut_s" "$back")
  echo "2 hosts x 2 ranks, node1 cut after step 10: relaunched on node0 x 2 ranks from $(basename "$ckpt"), training" \
       "again ${took} s after the cut, step $steps reached; steps $((from + 1))-$steps equal a clean resume bit for bit"
  ;;
slow)
  on_cluster slow --hosts 3 --ranks 1 --link 1gbit --slow-host 1 -- --steps 3 --set engine.deterministic=false
  status=$?; skip_if_refused "$dir/slow.log" $status
  [[ $status -eq 0 ]] || { cat "$dir/slow.log"; fail "training on 3 hosts with a slow one"; }
  grep "^links between hosts" "$dir/slow.log"
  grep -q "^warning: host node1 (ranks 1) is slow" "$dir/slow.log" || { cat "$dir/slow.log"; fail "the log does not name node1"; }
  grep -q "^done: 3 steps" "$dir/slow.log" || fail "training did not finish"
  echo "node1 at a tenth of the bandwidth: named in the log, training finished"
  ;;
*) echo "unknown case $case_name"; exit 2 ;;
esac

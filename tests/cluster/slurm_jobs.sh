#!/usr/bin/env bash
# tests/cluster/slurm_jobs.sh DIR ROOT WORKER STEPS [WORKER ARGS...]: the
# Slurm case of test_cluster.py (TestSlurm), run on the emulated cluster's head node
# (scripts/cluster --slurm): an uninterrupted job of STEPS steps, then a
# second one preempted with scancel --signal=TERM once it has run 8 steps,
# requeued with scontrol requeue, resuming with --resume auto. Prints each
# job's final state; the jobs' output is DIR/ref-JOB.out and DIR/pre-JOB.out
# (the preempted run's first part kept as DIR/pre-first.out). Last, what
# node1 and the head node see in /dev/shm after node0 wrote a file there.
set -u
dir=$1 root=$2 worker=$3 steps=$4
shift 4
cd "$dir" || exit 1
export MP_SRUN_CPU_BIND=none MP_WORKER=$worker
sb=(sbatch --parsable --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --requeue)
state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
wait_done() {  # JOB: until it has ended, 120 s at most
  for _ in $(seq 1 600); do
    case $(state "$1") in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) return 0 ;; esac
    sleep 0.2
  done
  echo "job $1 still $(state "$1") after 120 s"
  return 1
}

ref=$("${sb[@]}" --output="$dir/ref-%j.out" "$root/launch/mp.sbatch" "$@" --steps "$steps" --out "$dir/ref") || exit 1
wait_done "$ref" || exit 1
echo "reference job $ref: $(state "$ref")"

# Rank 0 sleeps 0.2 s a step (MP_FAULT, bits unchanged): the signal, sent
# after step 8, lands seconds before step STEPS even on a loaded machine
# (without it, 30 fast steps could end first and the signal would find the
# job finishing).
pre=$(MP_FAULT="sleep@1-1000000:0:0.2" "${sb[@]}" --output="$dir/pre-%j.out" "$root/launch/mp.sbatch" "$@" \
  --steps "$steps" --out "$dir/pre" --resume auto) || exit 1
for i in $(seq 1 600); do
  [[ -s $dir/pre/metrics.jsonl && $(wc -l < "$dir/pre/metrics.jsonl") -ge 8 ]] && break
  (( i < 600 )) || { echo "job $pre wrote no 8 steps in 120 s"; scancel "$pre"; exit 1; }
  sleep 0.2
done
scancel --signal=TERM "$pre"
wait_done "$pre" || exit 1
echo "preempted job $pre: $(state "$pre")"
cp "$dir/pre-$pre.out" "$dir/pre-first.out"
scontrol requeue "$pre" || exit 1  # it starts after the cluster's cred_expire (scripts/cluster: 5 s)
for _ in $(seq 1 50); do [[ $(state "$pre") != COMPLETED ]] && break; sleep 0.1; done
wait_done "$pre" || exit 1
echo "requeued job $pre: $(state "$pre")"
# Each host's /dev/shm is its own, as on real hosts (scripts/cluster): what
# node0 puts there, node1 and the head node do not see.
srun -N 1 -w node0 --mpi=none touch /dev/shm/mp_probe_node0 || exit 1
echo "node1's /dev/shm: [$(srun -N 1 -w node1 --mpi=none ls /dev/shm | tr '\n' ' ')]; the head's: [$(ls /dev/shm | grep mp_probe | tr '\n' ' ')]"

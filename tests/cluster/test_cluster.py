"""mp_worker on an emulated cluster (scripts/cluster: hosts as network
namespaces, TCP between them), launched by launch/mp_multinode as on a real
cluster, or by Slurm. Each class is one CTest (label "cluster"); every case
is skipped where the kernel refuses namespaces or the tests are not root
(scripts/cluster exits 77, "cannot emulate a cluster here").

  TestHybrid (cluster_hybrid): 2 hosts x 2 ranks, deterministic: HYBRID_SHARD
      (shard inside a host, replicate across) = FULL_SHARD on the 4 ranks = 1
      rank with 4 micro-batches, bit for bit (losses, norms, weights).
  TestResume (cluster_resume): a checkpoint written by 2 hosts x 2 ranks
      resumes on 1 host x 3 ranks and continues exactly as the uninterrupted run.
  TestCut (cluster_cut): node1's link goes down mid-run: every rank ends within
      the communication timeout plus a few seconds, the error names the host
      and its ranks, nothing is left behind.
  TestSlow (cluster_slow): 3 hosts, node1 at a tenth of the others' bandwidth:
      training goes on and the log names node1.
  TestSlurm (cluster_slurm): Slurm on the cluster (scripts/cluster --slurm):
      `sbatch launch/mp.sbatch` trains on 2 hosts x 2 ranks; a second job is
      preempted (scancel --signal=TERM: it checkpoints and exits 0), requeued
      (scontrol requeue) and resumes with --resume auto: its steps equal the
      uninterrupted job's bit for bit (slurm_jobs.sh runs the jobs).
  TestSrun (cluster_srun): Slurm on the cluster: `srun -N 2 -n 2 python
      examples/torch_llama.py` with no MPI: Slurm's variables say who each
      task is, the ranks meet at a store on node0 and train over Gloo
      (MP_PYTHON: the Python with torch and mp; python/CMakeLists.txt runs
      this class).
  TestElastic (cluster_elastic): launch/mp_elastic on 2 hosts x 2 ranks;
      node1's link is cut after step 10 of 30 (elastic_job.sh): the job ends
      naming node1, the supervisor relaunches on node0 alone (2 ranks, 2
      micro-batches each) from the last verified checkpoint, and training
      reaches step 30; the steps after the restart equal a clean resume from
      the same checkpoint on 2 ranks, bit for bit.
"""
import datetime
import os
import re
import subprocess
from pathlib import Path

import pytest
from mpworker import ROOT, SMALL_GPT, Checkpoints, Outcome, logged, losses, metrics, sets, step_dir, steps

CLUSTER = ROOT / "scripts" / "cluster"
MULTINODE = ROOT / "launch" / "mp_multinode"
SMALL = [*SMALL_GPT, *sets("engine.optimizer.schedule.total_steps=400", "engine.deterministic=true",
                           "engine.precision.reduce_dtype=FP32")]


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    return tmp_path_factory.getbasetemp()


@pytest.fixture(scope="module")
def on_cluster(worker, d):
    """on_cluster(name, cluster_args, command): scripts/cluster CLUSTER_ARGS --
    COMMAND; without a command, launch/mp_multinode training the small GPT
    into d/name with `args`. Every case skips where scripts/cluster cannot
    emulate a cluster (exit 77)."""
    def run(name, cluster_args, args=(), command=None, env=None, timeout=200):
        if command is None:
            command = [MULTINODE, "--", *SMALL, "--out", d / name, *args]
        r = worker.command(name, [CLUSTER, *cluster_args, "--", *command],
                           env={"MP_WORKER": worker.binary, **(env or {})}, timeout=timeout)
        if r.rc == 77:
            pytest.skip("\n".join(r.lines("cannot emulate")) or r.tail())
        return r
    return run


@pytest.fixture(scope="module")
def local(worker, d):
    """local(name, np, args): the small GPT under launch/mprun on this host, into d/name."""
    def run(name, np, args):
        r = worker.with_base(*SMALL).run(name, ["--out", d / name, *args], np=np)
        assert r.rc == 0, str(r)
        return r
    return run


def trained(run, run_dir):
    assert run.rc == 0, str(run)
    return Outcome(run=run, records=metrics(run_dir))


def namespaces():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()


def processes_matching(pattern):
    """Command lines of this machine's processes that match the regex."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if entry.isdigit() and re.search(pattern, cmdline):
            found.append(cmdline)
    return found


# ---- TestHybrid ------------------------------------------------------------------


@pytest.fixture(scope="module")
def hybrid(on_cluster, d):
    return trained(on_cluster("hybrid", ["--hosts", 2, "--ranks", 2],
                              ["--steps", 4, *sets("engine.sharding.strategy=HYBRID_SHARD",
                                                   "engine.sharding.hybrid_shard_size=2"),
                               "--export-safetensors", d / "hybrid.hf"]), d / "hybrid")


@pytest.fixture(scope="module")
def full_shard(on_cluster, d, hybrid):
    return trained(on_cluster("full", ["--hosts", 2, "--ranks", 2],
                              ["--steps", 4, *sets("engine.sharding.strategy=FULL_SHARD"),
                               "--export-safetensors", d / "full.hf"]), d / "full")


@pytest.fixture(scope="module")
def one_rank(local, d, hybrid):
    return trained(local("one", 1, ["--steps", 4, *sets("engine.micro_batches=4"),
                                    "--export-safetensors", d / "one.hf"]), d / "one")


class TestHybrid:
    def test_rank_2_runs_on_node1(self, hybrid):
        logged(hybrid.run, "^  rank 2: node1 ")

    def test_one_rank_trains_4_steps(self, one_rank):
        assert steps(one_rank.records) == [1, 2, 3, 4]

    def test_hybrid_shard_on_2_hosts_equals_1_rank_bitwise(self, hybrid, one_rank):
        assert losses(hybrid.records) == losses(one_rank.records)

    def test_full_shard_on_2_hosts_equals_1_rank_bitwise(self, full_shard, one_rank):
        assert losses(full_shard.records) == losses(one_rank.records)

    @pytest.mark.parametrize("strategy", ["hybrid", "full"])
    def test_weights_on_2_hosts_equal_1_ranks_byte_for_byte(self, d, hybrid, full_shard, one_rank, strategy):
        same = (d / f"{strategy}.hf" / "model.safetensors").read_bytes() == \
            (d / "one.hf" / "model.safetensors").read_bytes()
        assert same, f"{strategy}.hf/model.safetensors differs from 1 rank's"


# ---- TestResume ------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_hosts(on_cluster, d):
    """12 micro-batches a step either way: 4 ranks x 3, then 3 ranks x 4."""
    return trained(on_cluster("two_hosts", ["--hosts", 2, "--ranks", 2],
                              ["--steps", 6, *sets("engine.micro_batches=3", "checkpoint.interval_steps=3")]),
                   d / "two_hosts")


@pytest.fixture(scope="module")
def one_host(on_cluster, d, two_hosts):
    """A fresh run directory: steps 4-6 only."""
    return trained(on_cluster("one_host", ["--hosts", 1, "--ranks", 3],
                              ["--steps", 6, *sets("engine.micro_batches=4"),
                               "--resume", d / "two_hosts" / "checkpoints" / step_dir(3)]), d / "one_host")


class TestResume:
    def test_checkpoint_of_step_3_was_saved_by_4_ranks(self, d, two_hosts):
        assert Checkpoints(d / "two_hosts" / "checkpoints").manifest(3)["world_size"] == 4

    def test_resume_says_it_starts_at_step_3_from_4_ranks(self, one_host):
        logged(one_host.run, r"^resumed from .*step_00000003 at step 3 \(saved by 4 rank\(s\)")

    def test_one_host_x_3_ranks_trains_steps_4_to_6(self, one_host):
        assert steps(one_host.records) == [4, 5, 6]

    def test_steps_4_to_6_equal_the_2_host_runs_bitwise(self, two_hosts, one_host):
        assert losses(one_host.records) == losses(two_hosts.records)[3:6]


# ---- TestCut ---------------------------------------------------------------------

CUT_AT_S, TIMEOUT_S = 8, 6


@pytest.fixture(scope="module")
def cut(on_cluster, d, measured):
    """node1's link down 8 s into a long run (training by then, even on a
    loaded machine); the hosts' namespaces written to d/netns."""
    record_netns = ["bash", "-c", 'echo "$MP_CLUSTER_NETNS" > "$0/netns"; exec "$@"', d]
    run = on_cluster("cut", ["--hosts", 2, "--ranks", 2, "--cut", f"1:{CUT_AT_S}"],
                     command=[*record_netns, MULTINODE, "--", *SMALL, *sets("engine.deterministic=false"),
                              "--steps", 1000000, "--out", d / "run", *sets(f"engine.comm.timeout_s={TIMEOUT_S}")])
    measured(f"link cut at {CUT_AT_S} s: the job ended after {run.seconds:.0f} s (timeout {TIMEOUT_S} s), "
             f"exit {run.rc}")
    return run


class TestCut:
    def test_run_exits_nonzero_after_its_link_is_cut(self, cut):
        assert cut.rc != 0, str(cut)

    def test_node1s_link_goes_down_mid_run(self, cut):
        logged(cut, "node1's link is down")

    def test_error_names_node1_and_its_ranks(self, cut):
        logged(cut, r"Host node1 unreachable: none of its ranks answered \(2, 3\)")

    def test_error_names_the_ranks_host(self, cut):
        logged(cut, "rank 2 on node1, rank 3 on node1")

    def test_job_ends_within_the_timeout_and_its_graces(self, cut):
        # The ranks' deadline is the timeout plus the 2 s diagnosis and the
        # 5 s abort grace; mpirun then gives up on node1 within ~13 s
        # (tcp_retries2 = 5).
        limit = CUT_AT_S + TIMEOUT_S + 2 + 5 + 20
        assert cut.seconds <= limit, f"the job took {cut.seconds:.0f} s to end (limit {limit} s)"

    def test_no_namespace_is_left_behind(self, d, cut):
        left = set((d / "netns").read_text().split()) & set(namespaces())
        assert not left, f"namespaces left behind: {sorted(left)}"

    def test_no_rank_is_left_running(self, cut):
        assert cut.left_running == []


# ---- TestSlow --------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow(on_cluster, d, measured):
    r = trained(on_cluster("slow", ["--hosts", 3, "--ranks", 1, "--link", "1gbit", "--slow-host", 1],
                           ["--steps", 3, *sets("engine.deterministic=false")]), d / "slow")
    measured("\n".join(r.run.lines("^links between hosts")))
    return r


class TestSlow:
    def test_training_with_a_slow_host_finishes(self, slow):
        assert steps(slow.records) == [1, 2, 3]

    def test_log_names_node1_as_slow(self, slow):
        logged(slow.run, r"^warning: host node1 \(ranks 1\) is slow")


# ---- TestSlurm -------------------------------------------------------------------

SLURM_STEPS = 30


@pytest.fixture(scope="module")
def slurm(on_cluster, worker, d):
    """slurm_jobs.sh on the cluster's head node: a reference job, then one
    preempted after step 8 and requeued; their outputs in d/*.out, the
    cluster's directory (its daemons' files) in d/cluster_dir."""
    record_dir = ["bash", "-c", 'echo "$MP_CLUSTER_DIR" > "$0/cluster_dir"; exec "$@"', d]
    run = on_cluster("slurm", ["--hosts", 2, "--ranks", 2, "--slurm"],
                     command=[*record_dir, "bash", ROOT / "tests" / "cluster" / "slurm_jobs.sh", d, ROOT,
                              worker.binary, SLURM_STEPS, *SMALL])
    outs = "\n".join(f"{p}:\n{p.read_text(errors='replace')}" for p in sorted(d.glob("*.out")))
    assert run.rc == 0, f"{run}\n{outs}"
    states = dict(re.findall(r"^(reference|preempted|requeued) job [0-9]+: ([A-Z_]+)$", run.log, re.M))
    first = (d / "pre-first.out").read_text(errors="replace")
    stop = re.search(rf"got SIGTERM at step ([0-9]+) of {SLURM_STEPS}: checkpoint saved", first)
    cluster = re.search(r"^scripts/cluster: cluster (mpc[0-9]+):", run.log, re.M)
    return Outcome(run=run, states=states, first=first, stop=int(stop[1]) if stop else None,
                   name=cluster[1] if cluster else None, dir=(d / "cluster_dir").read_text().strip(),
                   ref_out="".join(p.read_text(errors="replace") for p in d.glob("ref-*.out")),
                   requeued_out="".join(p.read_text(errors="replace") for p in d.glob("pre-[0-9]*.out")),
                   want=metrics(d / "ref"), got=metrics(d / "pre"))


class TestSlurm:
    def test_sbatch_job_completes(self, slurm):
        assert slurm.states.get("reference") == "COMPLETED", str(slurm.run)

    def test_sbatch_job_places_rank_3_on_node1(self, slurm):
        assert re.search(r"^  rank 3: node1 ", slurm.ref_out, re.M), slurm.ref_out

    def test_sbatch_job_trains_every_step(self, slurm):
        assert steps(slurm.want) == list(range(1, SLURM_STEPS + 1))

    def test_preempted_job_completes(self, slurm):
        assert slurm.states.get("preempted") == "COMPLETED", str(slurm.run)

    def test_preempted_job_checkpoints_on_sigterm(self, slurm):
        assert slurm.stop is not None, slurm.first

    def test_requeued_job_completes(self, slurm):
        assert slurm.states.get("requeued") == "COMPLETED", str(slurm.run)

    def test_requeued_job_resumes_from_the_sigterm_checkpoint(self, slurm):
        pattern = rf"^resumed from .*step_0*{slurm.stop} at step {slurm.stop}"
        assert re.search(pattern, slurm.requeued_out, re.M), slurm.requeued_out

    def test_preempted_and_requeued_job_equals_the_uninterrupted_one_bitwise(self, slurm):
        assert losses(slurm.got) == losses(slurm.want)

    def test_each_host_has_its_own_dev_shm(self, slurm):
        # Shared, two clusters' same-numbered jobs opened each other's Open
        # MPI shared-memory segments and segfaulted (docs/reliability.md).
        seen = re.search(r"^node1's /dev/shm: \[(.*)\]; the head's: \[(.*)\]$", slurm.run.log, re.M)
        assert seen, str(slurm.run)
        assert "mp_probe_node0" not in seen[1] and not seen[2].strip(), seen[0]

    def test_no_namespace_is_left_behind(self, slurm):
        assert slurm.name, str(slurm.run)
        left = [ns for ns in namespaces() if re.match(rf"{slurm.name}[hd]", ns)]
        assert not left, f"namespaces of {slurm.name} left behind: {left}"

    def test_no_slurm_or_munge_daemon_is_left_running(self, slurm):
        left = processes_matching(re.escape(slurm.dir) + "/slurm/")
        assert not left, f"Slurm or munge daemons of {slurm.dir} left running: {left}"


# ---- TestSrun ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def srun(on_cluster):
    """srun -N 2 -n 2 --mpi=none on the head node; MASTER_ADDR is node0's
    address (the emulated hosts' names are not in DNS)."""
    python = os.environ.get("MP_PYTHON")
    if not python:
        pytest.skip("MP_PYTHON (a Python with torch and mp) is not set")
    script = ('export MASTER_ADDR=$(scontrol show node node0 | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p"); '
              'exec srun -N 2 -n 2 --mpi=none "$@"')
    run = on_cluster("srun", ["--hosts", 2, "--ranks", 2, "--slurm"],
                     command=["bash", "-c", script, "srun", python, ROOT / "examples" / "torch_llama.py",
                              "--steps", 3, "--layers", 2, "--threads", 1, "--recipe", "RECIPE_FP32",
                              "--deterministic"])
    assert run.rc == 0, str(run)
    return run


class TestSrun:
    def test_rank_0_finds_its_ranks_in_slurms_variables_and_trains_over_gloo(self, srun):
        logged(srun, r"ranks: Slurm \(SLURM_PROCID=0, .*\): rank 0 of 2.*data plane: Gloo over TCP, MPI not started")

    def test_three_steps_are_trained(self, srun):
        logged(srun, r"^step    3  loss")


# ---- TestElastic -----------------------------------------------------------------

ELASTIC_STEPS, CUT_AFTER = 30, 10


@pytest.fixture(scope="module")
def elastic(on_cluster, d):
    """elastic_job.sh on the head node, rank 0 sleeping 0.15 s a step so the
    cut lands mid-run; the supervisor's and the job's output in d/elastic.log."""
    run = on_cluster("cluster", ["--hosts", 2, "--ranks", 2],
                     command=["bash", ROOT / "tests" / "cluster" / "elastic_job.sh", d, ROOT, ELASTIC_STEPS, CUT_AFTER,
                              *SMALL, *sets("checkpoint.interval_steps=5", "checkpoint.keep_last=10",
                                            "engine.comm.timeout_s=6")],
                     env={"MP_FAULT": "sleep@1-1000:0:0.15"})
    log = (d / "elastic.log").read_text(errors="replace") if (d / "elastic.log").exists() else ""
    assert run.rc == 0, f"the elastic run did not finish: {run}\n{log[-3000:]}"
    verified = re.search(r": (.*/step_([0-9]+)) verifies$", log, re.M)
    return Outcome(run=run, log=log, records=metrics(d / "run"),
                   checkpoint=verified[1] if verified else None, start=int(verified[2]) if verified else None)


@pytest.fixture(scope="module")
def clean_resume(local, d, elastic, measured):
    """The elastic run's checkpoint resumed on 2 ranks, 2 micro-batches each."""
    assert elastic.checkpoint, elastic.log
    run = local("clean", 2, ["--steps", ELASTIC_STEPS, *sets("engine.micro_batches=2"), "--resume", elastic.checkpoint])
    back = re.search(r"^mp_elastic \[([0-9:.]+)\]: training again at step", elastic.log, re.M)
    if back:
        cut_s = float((d / "cut_at").read_text())
        h, m, s = back[1].split(":")
        day = datetime.datetime.fromtimestamp(cut_s, datetime.timezone.utc)
        took = day.replace(hour=int(h), minute=int(m), second=0, microsecond=0).timestamp() + float(s) - cut_s
        measured(f"elastic: node1 cut after step {CUT_AFTER}: relaunched on node0 x 2 ranks from "
                 f"{step_dir(elastic.start)}, training again {took:.1f} s after the cut")
    return trained(run, d / "clean")


class TestElastic:
    def test_failed_launch_names_node1_and_its_ranks(self, elastic):
        assert re.search(r"Host node1 unreachable: none of its ranks answered \(2, 3\)", elastic.log), elastic.log

    def test_node1_is_left_out(self, elastic):
        assert "node1 does not answer: left out" in elastic.log, elastic.log

    def test_relaunch_runs_on_node0_alone_with_2_micro_batches_each(self, elastic):
        assert "launch 1: 1 host(s) (node0) x 2 ranks, 2 micro-batch(es) each, --resume " in elastic.log, elastic.log

    def test_relaunch_starts_from_a_checkpoint_that_verifies(self, elastic):
        assert elastic.checkpoint, elastic.log

    def test_relaunch_finishes_training(self, elastic):
        assert "launch 1 finished training" in elastic.log, elastic.log
        assert elastic.records[-1]["step"] == ELASTIC_STEPS

    def test_steps_after_the_restart_equal_a_clean_resume_bitwise(self, elastic, clean_resume):
        after = [r for r in losses(elastic.records) if r[0] > elastic.start]
        assert len(after) == ELASTIC_STEPS - elastic.start, f"the elastic run logged {len(after)} steps after " \
                                                            f"{elastic.start}"
        assert after == losses(clean_resume.records)

"""mp_worker under injected faults (MP_FAULT, runtime/fault.h): 2 ranks of
the small GPT, 12 steps, each run within 120 s and leaving no worker
process. Each class is one CTest; --worker-args goes to every run
(scripts/gpu_check runs TestKilledRank, TestHungRank, TestNanGradients
and TestDeviceFault on GPU ranks with "--set compute.device=CUDA ...").

  TestKilledRank (worker_fault_kill_np2): rank 1 SIGKILLed at step 4: every
      rank exits non-zero promptly, mpirun names rank 1, nothing is left running.
  TestHungRank (worker_fault_hang_np2): rank 1 stops at step 4: rank 0's
      collective times out (3 s) naming the collective and rank 1; the job
      ends; the last checkpoint (every step) is step 3's, verifies and
      resumes. Again with 4 micro-batches, where the host runs far ahead of
      the stream: named the same way, ended within 30 s.
  TestStraggler (worker_fault_straggler_np2): rank 1 sleeps 1.5 s at step 4
      (timeout 10 s): training goes on and the log names rank 1 at step 4 only.
  TestNanGradients (worker_fault_nan_np2): rank 1's gradients of unit 2 are
      NaN at steps 4-5: both steps are skipped on every rank and the run
      finishes; the log names rank 1 and unit h1 (with engine.locate_non_finite)
      or says how to; with non_finite=NON_FINITE_STOP it stops at step 4 naming
      them; with max_consecutive_skips=2 and NaN at steps 4-9 it stops at step 5.
  TestFailedWrite (worker_fault_write_fail_np2): rank 1's checkpoint write
      fails at step 4: every rank prints the error and exits non-zero without
      MPI_Abort, and `latest` still names step 2's checkpoint, which verifies.
  TestFailedBackgroundWrite (worker_fault_write_fail_async_np2): the same with
      checkpoint.async_save: the error surfaces on every rank at the commit
      naming the file; step 4 is never committed.
  TestDeviceFault (CUDA ranks only: scripts/gpu_check): rank 1's GPU runs an
      illegal memory access at step 4: the job ends, the error names rank 1,
      its device, the step and the last collective; with MP_CUDA_SYNC=1 it
      names the kernel that faulted.
"""

import pytest
from mpworker import SMALL_GPT, Checkpoints, Outcome, logged, metrics, metrics_lines, not_logged, sets, step_dir, steps

WRITE_ERROR = r"shard_00001.bin': write failed: No space left on device"


@pytest.fixture(scope="module")
def w(worker):
    return worker.with_base(*SMALL_GPT, "--steps", 12)


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    return tmp_path_factory.getbasetemp()


@pytest.fixture(scope="module")
def fault(w, d):
    """fault(name, MP_FAULT, *args): a run into d/name (or d/out), its run directory read."""
    def run(name, mp_fault, *args, out=None, env=None):
        out = d / (out or name)
        r = w.run(name, ["--out", out, *args], env={"MP_FAULT": mp_fault, **(env or {})})
        assert not r.left_running, f"worker processes left running: {r.left_running}\n{r}"
        return Outcome(run=r, records=metrics(out), lines=metrics_lines(out),
                       checkpoints=Checkpoints(out / "checkpoints"))
    return run


def every_rank_says(run, pattern):
    """The ranks (0, 1) that have a line '[rank R] ...pattern'."""
    return [r for r in (0, 1) if run.lines(rf"^\[rank {r}\] .*{pattern}")]


# ---- TestKilledRank --------------------------------------------------------------


@pytest.fixture(scope="module")
def killed(w, measured):
    """Without --out: a run directory costs a killed job a second more to end."""
    run = w.run("kill", [], env={"MP_FAULT": "kill@4:1"})
    k = Outcome(run=run)
    measured(f"kill: rank 1 SIGKILLed at step 4; the job ended with exit code {k.run.rc} in "
             f"{k.run.seconds * 1000:.0f} ms from start, naming rank 1")
    return k


class TestKilledRank:
    def test_job_exits_nonzero(self, killed):
        assert killed.run.rc != 0, str(killed.run)

    def test_rank_1_is_killed_at_step_4(self, killed):
        logged(killed.run, "MP_FAULT: SIGKILL at step 4")

    def test_mpirun_names_rank_1(self, killed):
        logged(killed.run, r"rank 1 .*(exited on signal 9|Killed)")

    def test_nothing_is_left_running(self, killed):
        assert killed.run.left_running == []


# ---- TestHungRank ----------------------------------------------------------------


@pytest.fixture(scope="module")
def hung(fault, w, d):
    h = fault("hang", "hang@4:1", *sets("checkpoint.interval_steps=1", "engine.comm.timeout_s=3"))
    h.verify = w.verify("verify_hang", d / "hang" / "checkpoints")
    return h


@pytest.fixture(scope="module")
def resumed_after_hang(fault, hung):
    return fault("resume", "", "--resume", "auto", out="hang")


@pytest.fixture(scope="module")
def hung_accumulating(fault, hung, measured):
    """With 4 micro-batches the host enqueues far ahead of the compute stream
    (Note [Host runs ahead]); its waits must stay bounded all the same."""
    h = fault("hang_accumulating", "hang@4:1", *sets("engine.micro_batches=4", "engine.comm.timeout_s=3"))
    measured(f"hang: rank 1 stopped at step 4; rank 0 named it after the 3 s timeout; the job ended in "
             f"{hung.run.seconds * 1000:.0f} ms from start (exit {hung.run.rc}), with 4 micro-batches in "
             f"{h.run.seconds * 1000:.0f} ms; checkpoint step 3 verified and resumed: 0 completed steps lost")
    return h


class TestHungRank:
    def test_job_exits_nonzero(self, hung):
        assert hung.run.rc != 0, str(hung.run)

    def test_timeout_names_the_collective_and_the_missing_rank(self, hung):
        logged(hung.run, "did not complete within 3 s")
        logged(hung.run, "Not arrived: rank 1")

    def test_last_checkpoint_is_the_step_before_the_hang(self, hung):
        assert hung.checkpoints.latest == step_dir(3)

    def test_last_checkpoint_verifies(self, hung):
        assert hung.verify.rc == 0, str(hung.verify)

    def test_resume_auto_goes_on_from_step_3_to_the_end(self, hung, resumed_after_hang):
        assert resumed_after_hang.run.rc == 0, str(resumed_after_hang.run)
        assert resumed_after_hang.lines[:3] == hung.lines[:3], "steps 1-3 of metrics.jsonl were not left as they were"
        assert steps(resumed_after_hang.records) == list(range(1, 13))

    def test_resume_says_it_starts_at_step_3(self, resumed_after_hang):
        logged(resumed_after_hang.run, r"^resumed from .*step_00000003 at step 3 ")

    def test_with_4_micro_batches_the_job_exits_nonzero(self, hung_accumulating):
        assert hung_accumulating.run.rc != 0, str(hung_accumulating.run)

    def test_with_4_micro_batches_the_timeout_names_the_missing_rank(self, hung_accumulating):
        logged(hung_accumulating.run, "did not complete within 3 s")
        logged(hung_accumulating.run, "Not arrived: rank 1")

    def test_with_4_micro_batches_the_job_ends_within_30_s(self, hung_accumulating):
        assert hung_accumulating.run.seconds < 30, str(hung_accumulating.run)


# ---- TestStraggler ---------------------------------------------------------------


@pytest.fixture(scope="module")
def straggler(fault):
    return fault("straggler", "sleep@4:1:1.5", *sets("engine.comm.timeout_s=10"))


class TestStraggler:
    def test_training_goes_on_past_a_straggler_below_the_timeout(self, straggler):
        assert straggler.run.rc == 0, str(straggler.run)
        assert steps(straggler.records) == list(range(1, 13))

    def test_log_names_rank_1_as_the_straggler_at_step_4(self, straggler):
        pattern = r"^step 4: rank 1 is a straggler: [1-9]\.[0-9]+ s of work in this step"
        logged(straggler.run, pattern)

    def test_only_step_4_is_named(self, straggler):
        named = straggler.run.lines("is a straggler")
        assert len(named) <= 2, f"only step 4 had one (one more allowed for scheduling noise): {named}"


# ---- TestNanGradients ------------------------------------------------------------

LOCATE = sets("engine.locate_non_finite=true")


@pytest.fixture(scope="module")
def nan_unlocated(fault):
    return fault("nan_unlocated", "nan@4:1:2")


@pytest.fixture(scope="module")
def nan(fault, measured):
    n = fault("nan", "nan@4-5:1:2", *LOCATE)
    measured(f"nan: steps {[r['step'] for r in n.records if r['skipped']]} skipped, exit {n.run.rc}")
    return n


@pytest.fixture(scope="module")
def nan_stop(fault):
    return fault("nan_stop", "nan@4:1:2", *LOCATE, *sets("engine.non_finite=NON_FINITE_STOP"))


@pytest.fixture(scope="module")
def nan_repeat(fault):
    return fault("nan_repeat", "nan@4-9:1:2", *LOCATE, *sets("engine.max_consecutive_skips=2"))


class TestNanGradients:
    def test_a_skipped_step_does_not_end_the_run(self, nan_unlocated):
        assert nan_unlocated.run.rc == 0, str(nan_unlocated.run)
        assert [r["step"] for r in nan_unlocated.records if r["skipped"]] == [4]

    def test_without_locate_the_log_says_how_to_name_the_rank_and_unit(self, nan_unlocated):
        pattern = ("^step 4 skipped: non-finite gradients, set engine.locate_non_finite=true to name the rank "
                   "and unit")
        logged(nan_unlocated.run, pattern)

    def test_steps_4_and_5_are_skipped_and_the_run_finishes(self, nan):
        assert nan.run.rc == 0, str(nan.run)
        assert steps(nan.records) == list(range(1, 13))
        assert [r["step"] for r in nan.records if r["skipped"]] == [4, 5]

    def test_skipped_steps_name_rank_1_and_unit_h1(self, nan):
        for step, in_a_row in ((4, 1), (5, 2)):
            pattern = (f"^step {step} skipped: non-finite gradients, first from rank 1, unit h1; "
                       f"{in_a_row} in a row")
            logged(nan.run, pattern)
        assert len(nan.run.lines("skipped: non-finite")) == 2, str(nan.run)

    def test_progress_line_of_a_skipped_step_says_skipped(self, nan):
        logged(nan.run, r"^step  4/12 .*SKIPPED")

    def test_non_finite_stop_ends_the_job_at_step_4(self, nan_stop):
        assert nan_stop.run.rc != 0, str(nan_stop.run)
        assert steps(nan_stop.records) == [1, 2, 3]

    def test_non_finite_stop_names_rank_1_and_unit_h1_on_every_rank(self, nan_stop):
        pattern = (r"step 4: non-finite gradients, first from rank 1, unit h1; stopping "
                   r"\(non_finite = NON_FINITE_STOP\)")
        assert every_rank_says(nan_stop.run, pattern) == [0, 1], str(nan_stop.run)

    def test_non_finite_stop_ends_without_mpi_abort(self, nan_stop):
        not_logged(nan_stop.run, "MPI_ABORT")

    def test_max_consecutive_skips_2_ends_the_job_at_step_5(self, nan_repeat):
        assert nan_repeat.run.rc != 0, str(nan_repeat.run)
        assert every_rank_says(nan_repeat.run, "step 5: 2 steps in a row had non-finite gradients") == [0, 1], \
            str(nan_repeat.run)

    def test_max_consecutive_skips_ends_without_mpi_abort(self, nan_repeat):
        not_logged(nan_repeat.run, "MPI_ABORT")


# ---- TestFailedWrite, TestFailedBackgroundWrite ----------------------------------


@pytest.fixture(scope="module")
def write_failed(fault, w, d):
    f = fault("write_fail", "write_fail@4:1", *sets("checkpoint.interval_steps=2"))
    f.verify = w.verify("verify_write_fail", d / "write_fail" / "checkpoints")
    return f


@pytest.fixture(scope="module")
def background_write_failed(fault, w, d):
    f = fault("write_fail_async", "write_fail@4:1", *sets("checkpoint.interval_steps=2", "checkpoint.async_save=true"))
    f.verify = w.verify("verify_async", d / "write_fail_async" / "checkpoints")
    return f


class TestFailedWrite:
    def test_a_failed_checkpoint_write_ends_the_job_nonzero(self, write_failed):
        assert write_failed.run.rc != 0, str(write_failed.run)

    def test_rank_0_says_the_save_failed_on_rank_1_naming_the_file(self, write_failed):
        assert every_rank_says(write_failed.run, f"checkpoint save failed on rank 1: .*{WRITE_ERROR}") == [0], \
            str(write_failed.run)

    def test_rank_1_names_the_file_it_could_not_write(self, write_failed):
        assert 1 in every_rank_says(write_failed.run, WRITE_ERROR), str(write_failed.run)

    def test_ranks_end_without_mpi_abort(self, write_failed):
        not_logged(write_failed.run, "MPI_ABORT")

    def test_latest_stays_at_step_2(self, write_failed):
        assert write_failed.checkpoints.latest == step_dir(2)

    def test_latest_verifies(self, write_failed):
        assert write_failed.verify.rc == 0, str(write_failed.verify)


class TestFailedBackgroundWrite:
    def test_a_failed_background_write_ends_the_job_nonzero(self, background_write_failed):
        assert background_write_failed.run.rc != 0, str(background_write_failed.run)

    def test_step_4_is_snapshotted_and_written_in_the_background(self, background_write_failed):
        pattern = r"^checkpoint at step 4 \(interval\): snapshot of .* writing in the background"
        logged(background_write_failed.run, pattern)

    def test_rank_0_says_the_save_failed_on_rank_1_naming_the_file(self, background_write_failed):
        ranks = every_rank_says(background_write_failed.run, f"checkpoint save failed on rank 1: .*{WRITE_ERROR}")
        assert ranks == [0], str(background_write_failed.run)

    def test_rank_1_names_the_file_it_could_not_write(self, background_write_failed):
        assert 1 in every_rank_says(background_write_failed.run, WRITE_ERROR), str(background_write_failed.run)

    def test_ranks_end_without_mpi_abort(self, background_write_failed):
        not_logged(background_write_failed.run, "MPI_ABORT")

    def test_step_4_is_never_committed(self, background_write_failed):
        assert 4 not in background_write_failed.checkpoints.steps
        not_logged(background_write_failed.run, "^checkpoint at step 4 committed")

    def test_latest_stays_at_step_2(self, background_write_failed):
        assert background_write_failed.checkpoints.latest == step_dir(2)

    def test_latest_verifies(self, background_write_failed):
        assert background_write_failed.verify.rc == 0, str(background_write_failed.verify)


# ---- TestDeviceFault -------------------------------------------------------------


@pytest.fixture(scope="module")
def device_faulted(fault, w, measured):
    if "compute.device=CUDA" not in w.extra:
        measured("device_fault: skipped: it needs CUDA ranks (--worker-args '--set compute.device=CUDA ...')")
        pytest.skip("device_fault needs CUDA ranks: --worker-args '--set compute.device=CUDA ...'")
    f = fault("device_fault", "device_fault@4:1", *sets("engine.comm.timeout_s=5"))
    measured(f"device_fault: rank 1's illegal memory access at step 4 ended the job in {f.run.seconds * 1000:.0f} "
             "ms from start, naming rank 1, its device, the step and the last collective")
    return f


@pytest.fixture(scope="module")
def device_faulted_sync(fault, device_faulted):
    return fault("device_fault_sync", "device_fault@4:1", *sets("engine.comm.timeout_s=5"), env={"MP_CUDA_SYNC": "1"})


class TestDeviceFault:
    def test_job_exits_nonzero(self, device_faulted):
        assert device_faulted.run.rc != 0, str(device_faulted.run)

    def test_fault_fires_on_a_cuda_device_at_step_4(self, device_faulted):
        logged(device_faulted.run, "MP_FAULT: device fault on cuda:[0-9]+ at step 4")

    def test_rank_1_names_the_illegal_memory_access(self, device_faulted):
        logged(device_faulted.run, r"\[rank 1\] .*(illegal memory access|IllegalAddress)")

    def test_error_names_the_rank_device_step_and_last_collective(self, device_faulted):
        # The fault surfaces at the rank's next CUDA call: on its compute
        # thread (Engine::step adds where: rank, device, step, last collective)
        # or on its communication thread (a CommError naming the collective).
        pattern = r"\[rank 1 on cuda:[0-9]+, step 4; last collective issued: |\[rank 1\] .*CommError|collective"
        logged(device_faulted.run, pattern)

    def test_with_cuda_sync_the_faulting_op_is_named(self, device_faulted_sync):
        assert device_faulted_sync.run.rc != 0, str(device_faulted_sync.run)
        pattern = r"\[rank 1\] .*op device_fault on cuda:[0-9]+ failed: cudaErrorIllegalAddress"
        logged(device_faulted_sync.run, pattern)

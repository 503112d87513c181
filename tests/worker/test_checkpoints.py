"""mp_worker's checkpoints end to end: 2 ranks of the small GPT under
launch/mprun, read back from metrics.jsonl and the checkpoint root. Each
class is one CTest; --worker-args goes to every run (CTest runs TestSigterm
and TestRandomSigkill again with --set checkpoint.async_save=true, and
TestResume with optimizer kind MUON).

  TestResume (worker_checkpoint_resume_np2, worker_checkpoint_resume_muon_np2):
      a run resumed from its step-4 checkpoint keeps steps 1-4 of metrics.jsonl
      and writes the losses and gradient norms of the uninterrupted run, bit
      for bit; a 2-rank FULL_SHARD checkpoint resumes on 1 rank as
      SHARD_GRAD_OP; an export to Hugging Face safetensors starts a new run
      near the loss where the other ended.
  TestSigterm (worker_checkpoint_signal_np2, worker_checkpoint_signal_async_np2):
      SIGTERM mid-run saves a checkpoint at the next step boundary and exits
      0; --resume auto goes on from there; a job requeued after it finished
      trains nothing and exits 0.
  TestRandomSigkill (worker_checkpoint_crash_np2, worker_checkpoint_crash_async_np2):
      SIGKILL of one rank at a random moment of a run that saves every step,
      --rounds times: no rank is left running, `latest` always names a
      checkpoint that verifies, and the last one resumes.
  TestAsyncSaves (worker_checkpoint_async_np2): checkpoint.async_save gives the
      losses of synchronous saves and the same shard files byte for byte,
      `latest` names the last one at the end, and a resume from one is bit
      for bit; MP_FAULT save_kill: rank 1 SIGKILLed in the middle of step 8's
      background write leaves `latest` at step 4, which verifies, and
      --resume auto repeats the uninterrupted run's steps 5-12 bit for bit.
"""
import os
import random
import signal
import time

import pytest
from mpworker import (SMALL_GPT, Checkpoints, Outcome, logged, losses, metrics, metrics_lines, sets, step_dir,
                      steps, wait_for)

EVERY_4 = sets("checkpoint.interval_steps=4")
ASYNC = sets("checkpoint.async_save=true")


def kept_lines(before, after):
    """How many leading lines of metrics.jsonl a later run left as they
    were (timings included): a resume from step S keeps exactly S."""
    n = 0
    while n < min(len(before), len(after)) and before[n] == after[n]:
        n += 1
    return n


def assert_resumed_at(step, before, after):
    kept = kept_lines(before, after)
    assert kept == step, (f"the resumed run left the first {kept} lines of metrics.jsonl as they were; "
                          f"a resume from step {step} leaves {step} and rewrites the rest")


def first_difference(want, got):
    for a, b in zip(want, got):
        if a != b:
            return f"first difference (step, loss, gradient norm): {a} uninterrupted, {b} here"
    return f"{len(want)} steps uninterrupted, {len(got)} here"


def finished(run, run_dir=None):
    """A run that must have exited 0, with its run directory's metrics."""
    assert run.rc == 0, str(run)
    return Outcome(run=run, lines=metrics_lines(run_dir) if run_dir else [],
                   records=metrics(run_dir) if run_dir else [])


@pytest.fixture(scope="module")
def w(worker):
    return worker.with_base(*SMALL_GPT, *sets("engine.optimizer.schedule.total_steps=400"))


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    return tmp_path_factory.getbasetemp()


# ---- TestResume ------------------------------------------------------------------


@pytest.fixture(scope="module")
def full(w, d):
    """12 steps, a checkpoint every 4."""
    return finished(w.run("full", ["--steps", 12, "--out", d / "full", *EVERY_4]), d / "full")


@pytest.fixture(scope="module")
def resumed(w, d, full):
    """The same run directory again, from step 4's checkpoint."""
    return finished(w.run("resume", ["--steps", 12, "--out", d / "full",
                                     "--resume", d / "full" / "checkpoints" / step_dir(4)]), d / "full")


@pytest.fixture(scope="module")
def resharded(w, d, resumed):
    """The 2-rank checkpoint of step 12 on 1 rank as SHARD_GRAD_OP, to step 14."""
    return finished(w.run("reshard", ["--steps", 14, "--resume", d / "full" / "checkpoints", "--out", d / "reshard",
                                      *sets("engine.sharding.strategy=SHARD_GRAD_OP", "engine.micro_batches=2")],
                          np=1), d / "reshard")


@pytest.fixture(scope="module")
def exported(w, d, resumed):
    finished(w.run("export", ["--steps", 12, "--resume", d / "full" / "checkpoints", "--export-safetensors", d / "hf"]))
    return d / "hf"


@pytest.fixture(scope="module")
def imported(w, d, exported):
    """One step of a new run that starts from the exported weights."""
    return finished(w.run("import", ["--steps", 1, "--out", d / "imported",
                                     *sets(f"checkpoint.init_from_safetensors={exported}")]), d / "imported")


class TestResume:
    def test_uninterrupted_run_writes_one_metrics_record_per_step(self, full):
        assert steps(full.records) == list(range(1, 13))

    def test_checkpoint_of_step_4_records_2_ranks_and_full_shard(self, d, full):
        manifest = Checkpoints(d / "full" / "checkpoints").manifest(4)
        assert manifest == {"step": 4, "world_size": 2, "strategy": "FULL_SHARD"}

    def test_resume_from_step_4_keeps_steps_1_to_4_of_the_metrics_and_rewrites_the_rest(self, full, resumed):
        assert_resumed_at(4, full.lines, resumed.lines)
        assert steps(resumed.records) == list(range(1, 13))

    def test_resumed_run_repeats_steps_5_to_12_bitwise(self, full, resumed):
        want, got = losses(full.records), losses(resumed.records)
        assert got == want, first_difference(want, got)

    def test_resume_says_which_checkpoint_and_who_saved_it(self, resumed):
        pattern = r"^resumed from .*/step_00000004 at step 4 \(saved by 2 rank\(s\), FULL_SHARD"
        logged(resumed.run, pattern)

    def test_two_rank_checkpoint_continues_on_one_rank_as_shard_grad_op(self, d, resharded):
        assert Checkpoints(d / "full" / "checkpoints").manifest(12)["world_size"] == 2
        assert steps(resharded.records) == [13, 14]

    def test_resharded_run_keeps_the_loss_in_range(self, resharded):
        assert 3.0 <= resharded.records[-1]["loss"] < 5.0, resharded.records[-1]

    def test_export_writes_model_safetensors_and_config_json(self, exported):
        for name in ("model.safetensors", "config.json"):
            assert (exported / name).is_file() and (exported / name).stat().st_size > 0, exported / name

    def test_run_from_the_export_starts_near_the_loss_the_exported_run_ended_at(self, full, imported):
        # From random weights step 1's loss is 5.57, about ln 256. The export
        # holds the weights after step 12's update, whose loss was taken
        # before it: with Muon's larger steps about 0.35 lower.
        end, start = full.records[-1]["loss"], imported.records[0]["loss"]
        assert abs(end - start) < 0.5 and start < 5.2, f"the export ended at loss {end}, the import started at {start}"


# ---- TestSigterm -----------------------------------------------------------------


@pytest.fixture(scope="module")
def stopped(w, d, measured):
    """A long run whose ranks are sent SIGTERM once it has logged 3 steps."""
    job = w.start("sigterm", ["--steps", 100000, "--out", d / "run"])
    wait_for(lambda: len(metrics_lines(d / "run")) >= 3, 60, "3 steps in metrics.jsonl")
    ranks = job.ranks()
    assert ranks, "no worker ranks found"
    sent = time.monotonic()
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    run = job.wait()
    ms = (time.monotonic() - sent) * 1000
    records = metrics(d / "run")
    measured(f"SIGTERM: checkpoint at step {records[-1]['step']}, exit {run.rc}, {ms:.0f} ms after the signal")
    return Outcome(run=run, lines=metrics_lines(d / "run"), records=records, step=records[-1]["step"],
                   checkpoints=Checkpoints(d / "run" / "checkpoints"))


@pytest.fixture(scope="module")
def resumed_after_sigterm(w, d, stopped):
    return finished(w.run("sigterm_resume", ["--steps", stopped.step + 2, "--out", d / "run", "--resume", "auto"]), d / "run")


@pytest.fixture(scope="module")
def requeued(w, d, stopped, resumed_after_sigterm):
    """A job requeued after it finished: its last checkpoint is at --steps."""
    return finished(w.run("requeued", ["--steps", stopped.step, "--out", d / "run", "--resume", "auto"]), d / "run")


class TestSigterm:
    def test_sigterm_exits_0(self, stopped):
        assert stopped.run.rc == 0, str(stopped.run)

    def test_sigterm_saves_a_checkpoint_of_the_step_it_finished(self, stopped):
        assert stopped.step >= 3
        assert stopped.checkpoints.latest == step_dir(stopped.step)
        assert stopped.checkpoints.manifest(stopped.step)["step"] == stopped.step

    def test_log_names_the_step_of_the_sigterm_checkpoint(self, stopped):
        pattern = rf"^got SIGTERM at step {stopped.step} of 100000: checkpoint saved"
        logged(stopped.run, pattern)

    def test_resume_auto_goes_on_from_the_sigterm_checkpoint(self, stopped, resumed_after_sigterm):
        assert_resumed_at(stopped.step, stopped.lines, resumed_after_sigterm.lines)
        assert steps(resumed_after_sigterm.records) == list(range(1, stopped.step + 3))

    def test_requeued_job_that_had_finished_trains_nothing_and_exits_0(self, stopped, requeued):
        assert requeued.lines == stopped.lines

    def test_requeued_job_that_had_finished_says_so(self, stopped, requeued):
        pattern = rf"^done: already at step {stopped.step} of {stopped.step}, nothing to train"
        logged(requeued.run, pattern)


# ---- TestRandomSigkill -----------------------------------------------------------


@pytest.fixture(scope="module")
def kill_rounds(w, d, request):
    """Each round: --resume auto, a checkpoint every step (2 kept); once the
    round's first checkpoint is committed, SIGKILL to one rank chosen at
    random, at a random moment within a second; then --verify-checkpoint."""
    checkpoints = Checkpoints(d / "crash" / "checkpoints")
    done = []
    for r in range(1, request.config.getoption("--rounds") + 1):
        before = checkpoints.latest_step or 0
        job = w.start(f"round{r}", ["--steps", 100000, "--out", d / "crash", "--resume", "auto",
                                    *sets("checkpoint.interval_steps=1", "checkpoint.keep_last=2")])
        wait_for(lambda: (checkpoints.latest_step or 0) > before, 60, f"round {r}'s first checkpoint")
        time.sleep(random.randrange(100) / 100)
        ranks = job.ranks()
        if ranks:
            os.kill(random.choice(ranks), signal.SIGKILL)
        run = job.wait()
        done.append(Outcome(round=r, run=run, partial=checkpoints.partial,
                            verify=w.verify(f"verify{r}", checkpoints.root)))
    return done


@pytest.fixture(scope="module")
def after_rounds(w, d, kill_rounds, measured):
    """The last round's latest checkpoint, resumed for one step."""
    step = Checkpoints(d / "crash" / "checkpoints").latest_step
    run = finished(w.run("final", ["--steps", step + 1, "--out", d / "crash", "--resume", "auto"]), d / "crash")
    interrupted = sum(1 for r in kill_rounds if r.partial)
    measured(f"{len(kill_rounds)} rounds of SIGKILL, {interrupted} of them during a save (a .tmp- directory left): "
             f"latest always verified; step {step} resumes")
    return Outcome(step=step, run=run)


class TestRandomSigkill:
    def test_no_rank_is_left_running_after_one_is_killed(self, kill_rounds):
        left = {r.round: r.run.left_running for r in kill_rounds if r.run.left_running}
        assert not left, f"worker processes left running after the kill, by round: {left}"

    def test_latest_always_names_a_checkpoint_that_verifies(self, kill_rounds):
        failed = [f"round {r.round}: {r.verify}" for r in kill_rounds if r.verify.rc != 0]
        assert not failed, "\n".join(failed)

    def test_last_checkpoint_resumes_and_trains(self, after_rounds):
        assert after_rounds.run.records[-1]["step"] == after_rounds.step + 1


# ---- TestAsyncSaves --------------------------------------------------------------


@pytest.fixture(scope="module")
def sync(w, d):
    return finished(w.run("sync", ["--steps", 12, "--out", d / "sync", *EVERY_4]), d / "sync")


@pytest.fixture(scope="module")
def asynchronous(w, d, sync):
    return finished(w.run("async", ["--steps", 12, "--out", d / "async", *EVERY_4, *ASYNC]), d / "async")


@pytest.fixture(scope="module")
def async_resumed(w, d, asynchronous):
    return finished(w.run("async_resume", ["--steps", 12, "--out", d / "async", *ASYNC,
                                           "--resume", d / "async" / "checkpoints" / step_dir(4)]), d / "async")


@pytest.fixture(scope="module")
def killed(w, d, async_resumed):
    """Rank 1 SIGKILLed in the middle of step 8's background write."""
    run = w.run("killed", ["--steps", 12, "--out", d / "killed", *EVERY_4, *ASYNC], env={"MP_FAULT": "save_kill@8:1"})
    return Outcome(run=run, lines=metrics_lines(d / "killed"),
                   checkpoints=Checkpoints(d / "killed" / "checkpoints"),
                   verify=w.verify("verify_killed", d / "killed" / "checkpoints"))


@pytest.fixture(scope="module")
def killed_resumed(w, d, killed):
    return finished(w.run("killed_resume", ["--steps", 12, "--out", d / "killed", *EVERY_4, *ASYNC,
                                            "--resume", "auto"]), d / "killed")


class TestAsyncSaves:
    def test_async_saves_give_the_losses_of_synchronous_saves(self, sync, asynchronous):
        want, got = losses(sync.records), losses(asynchronous.records)
        assert got == want, first_difference(want, got)

    @pytest.mark.parametrize("step", [4, 8, 12])
    def test_async_shard_files_equal_the_synchronous_ones_byte_for_byte(self, d, asynchronous, step):
        for rank in (0, 1):
            same = (Checkpoints(d / "sync" / "checkpoints").shard(step, rank) ==
                    Checkpoints(d / "async" / "checkpoints").shard(step, rank))
            assert same, f"{step_dir(step)}/shard_{rank:05d}.bin differs from the synchronous save's"

    def test_latest_names_step_12_when_the_run_ends(self, d, asynchronous):
        assert Checkpoints(d / "async" / "checkpoints").latest == step_dir(12)

    def test_async_checkpoint_verifies(self, w, d, asynchronous):
        run = w.verify("verify_async", d / "async" / "checkpoints")
        assert run.rc == 0, str(run)

    def test_run_log_says_checkpoints_are_written_in_the_background(self, asynchronous):
        logged(asynchronous.run, r"^checkpoints: .*written in the background")

    def test_memory_plan_shows_the_checkpoint_snapshot(self, asynchronous):
        logged(asynchronous.run, r"^\(checkpoint snapshot, host\) ")

    def test_log_says_when_step_4_was_committed(self, asynchronous):
        logged(asynchronous.run, r"^checkpoint at step 4 committed: .*/step_00000004, ")

    def test_resume_from_an_async_checkpoint_repeats_steps_5_to_12_bitwise(self, sync, async_resumed):
        want, got = losses(sync.records), losses(async_resumed.records)
        assert got == want, first_difference(want, got)

    def test_rank_killed_during_a_background_write_ends_the_job_nonzero(self, killed):
        assert killed.run.rc != 0, str(killed.run)

    def test_no_rank_is_left_running_after_the_kill(self, killed):
        assert killed.run.left_running == []

    def test_the_kill_lands_in_step_8s_write(self, killed):
        logged(killed.run, "MP_FAULT: SIGKILL while writing the checkpoint of step 8")
        assert ".tmp-" + step_dir(8) in killed.checkpoints.partial

    def test_latest_stays_at_step_4_after_the_kill(self, killed):
        assert killed.checkpoints.latest == step_dir(4)

    def test_latest_verifies_after_the_kill(self, killed):
        assert killed.verify.rc == 0, str(killed.verify)

    def test_resume_auto_after_the_kill_goes_on_from_step_4(self, killed, killed_resumed):
        assert_resumed_at(4, killed.lines, killed_resumed.lines)

    def test_resume_auto_after_the_kill_repeats_steps_5_to_12_bitwise(self, sync, killed_resumed):
        want, got = losses(sync.records), losses(killed_resumed.records)
        assert got == want, first_difference(want, got)
